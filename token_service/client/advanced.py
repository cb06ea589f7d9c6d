"""The SDK's advanced names: what typed code and custom integrations need beyond the basics.

:mod:`token_service.client` exports what the docs teach; this module adds what a
caller may need once past it, each documented in docs/sdk.md ("Public names"):

- the values the client's methods return (``IssuedToken``, ``TokenInfo``, ``Consumed``,
  ``Started``, ``Finished``, ``Completed``, ``FailRecorded``, ``Renewed``), to annotate with;
- the fingerprint functions under every guard (``fingerprint`` of any JSON value,
  ``http_fingerprint`` of an HTTP request's ``RequestFacts``);
- the result codec of typed results (``dump_result``, ``load_result``) and the warning
  ``UnresolvedResultType``;
- ``DirectLimits`` (``TokenClient.from_redis(limits=...)``), ``describe_error`` (what a
  terminal failure stores by default) and ``operation_token`` (the name a keyed operation's
  record is kept under).
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
