"""The token-service client SDK: what backend services import.

``TokenClient`` talks to the service over HTTP or runs the very same Lua scripts on the shared
Redis (``TokenClient.from_redis(url)``); ``AsyncTokenClient`` is the asyncio twin. This package
does not import Flask: each integration is a module of its own (``flask``, ``fastapi``,
``django``, ``celery``, ``wsgi``, ``asgi``, ``durable``), and what a typed caller or a custom
integration needs beyond that is :mod:`token_service.client.advanced` (docs/sdk.md).
"""

from __future__ import annotations

from token_service.errors import (
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

from ._client import AsyncTokenClient, TokenClient
from ._fingerprint import fields_fingerprint
from ._telemetry import Telemetry
from ._types import RetryPolicy
from .guard import AsyncGuard, Guard, GuardHooks, Replayed
from .keyed import idempotent, keyed_guard

# What the docs teach, and nothing else: docs/sdk.md's "Public names" lists it, and
# tests/test_public_api.py holds the two equal. Reply values, fingerprint helpers and the
# rest are in token_service.client.advanced.
__all__ = [
    "AsyncGuard",
    "AsyncTokenClient",
    "Guard",
    "GuardHooks",
    "InvalidRequest",
    "LeaseLost",
    "OutcomeNotRecorded",
    "PayloadTooLarge",
    "RateLimited",
    "Replayed",
    "RetryPolicy",
    "ServiceUnavailable",
    "Telemetry",
    "TokenClient",
    "TokenError",
    "TokenFailed",
    "TokenInProgress",
    "TokenInvalid",
    "TokenMismatch",
    "TokenUsed",
    "Unauthorized",
    "UnexpectedReply",
    "fields_fingerprint",
    "idempotent",
    "keyed_guard",
]
