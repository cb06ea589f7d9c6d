"""The SDK's advanced names: what typed code and custom integrations need beyond the basics.

:mod:`token_service.client` exports what the docs teach; this module adds the reply values to
annotate with, the fingerprint functions, the result codec, ``DirectLimits``, ``describe_error``
and ``operation_token``, each documented in docs/sdk.md ("Public names").
"""

from __future__ import annotations

from ._direct import DirectLimits
from ._fingerprint import RequestFacts, fingerprint, http_fingerprint
from ._typed_results import UnresolvedResultType, dump_result, load_result
from ._types import Completed, Consumed, FailRecorded, Finished, IssuedToken, Renewed, Started, TokenInfo
from .guard import describe_error
from .keyed import operation_token

__all__ = [
    "Completed",
    "Consumed",
    "DirectLimits",
    "FailRecorded",
    "Finished",
    "IssuedToken",
    "Renewed",
    "RequestFacts",
    "Started",
    "TokenInfo",
    "UnresolvedResultType",
    "describe_error",
    "dump_result",
    "fingerprint",
    "http_fingerprint",
    "load_result",
    "operation_token",
]
