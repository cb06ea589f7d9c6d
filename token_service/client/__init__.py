"""The token-service client SDK: what backend services import.

``TokenClient`` talks to the service over HTTP (``TokenClient(base_url, api_key)``)
or runs the very same Lua scripts on the shared Redis
(``TokenClient.from_redis(url)``); ``AsyncTokenClient`` is the asyncio twin.
Errors are the classes of :mod:`token_service.errors`, one per error code.

This package does not import Flask. The Flask view decorator lives in
:mod:`token_service.client.flask` (``require_token``) and the WSGI
``Idempotency-Key`` middleware in :mod:`token_service.client.wsgi`
(its ASGI twin in :mod:`token_service.client.asgi`). ``fingerprint`` is the one
fingerprint function of every guard (``http_fingerprint`` for an HTTP request).
``idempotent`` / ``keyed_guard`` run any function at most once per key
(:mod:`token_service.client.keyed`), no token needed.
"""

from __future__ import annotations

from typing import Any

from token_service.errors import (
    ERRORS_BY_CODE,
    InvalidRequest,
    LeaseLost,
    OutcomeNotRecorded,
    PayloadTooLarge,
    RateLimited,
    ServiceUnavailable,
    TokenError,
    TokenFailed,
    TokenInProgress,
    TokenInvalid,
    TokenMismatch,
    TokenUsed,
    Unauthorized,
    UnexpectedReply,
)
from token_service.tokens import new_request_id

from ._client import AsyncTokenClient, TokenClient
from ._direct import DirectLimits
from ._fingerprint import RequestFacts, fields_fingerprint, fingerprint, http_fingerprint
from ._stored_response import StoredResponse, default_store_status
from ._telemetry import Telemetry
from ._typed_results import UnresolvedResultType, dump_result, load_result
from ._types import (
    Completed,
    Consumed,
    FailRecorded,
    Finished,
    IssuedToken,
    Renewed,
    RetryPolicy,
    Started,
    TokenInfo,
)
from .guard import AsyncGuard, Guard, GuardHooks, Replayed, describe_error, guarded
from .keyed import idempotent, keyed_guard, operation_token

__all__ = [
    "ERRORS_BY_CODE",
    "AsyncGuard",
    "AsyncTokenClient",
    "Completed",
    "Consumed",
    "DirectLimits",
    "FailRecorded",
    "Finished",
    "Guard",
    "GuardHooks",
    "InvalidRequest",
    "IssuedToken",
    "LeaseLost",
    "OutcomeNotRecorded",
    "PayloadTooLarge",
    "RateLimited",
    "Renewed",
    "Replayed",
    "RequestFacts",
    "RetryPolicy",
    "ServiceUnavailable",
    "Started",
    "StoredResponse",
    "Telemetry",
    "TokenClient",
    "TokenError",
    "TokenFailed",
    "TokenInProgress",
    "TokenInfo",
    "TokenInvalid",
    "TokenMismatch",
    "TokenUsed",
    "Unauthorized",
    "UnexpectedReply",
    "UnresolvedResultType",
    "default_store_status",
    "describe_error",
    "dump_result",
    "fields_fingerprint",
    "fingerprint",
    "guarded",
    "http_fingerprint",
    "idempotent",
    "keyed_guard",
    "load_result",
    "new_request_id",
    "operation_token",
    "require_token",
]


def __getattr__(name: str) -> Any:
    # Flask only when the Flask decorator is asked for.
    if name == "require_token":
        from .flask import require_token

        return require_token
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
