"""The error hierarchy shared by the store, the HTTP API and the SDK.

Every failure a caller can meet has one narrow class whose ``code`` is the
stable machine-readable code of the API's error table (openapi.yaml,
docs/http-api.md) and whose ``status`` is
the HTTP status the API answers with. The SDK raises the very same classes, so
a backend never parses HTTP to learn what happened. This module imports
nothing outside the standard library: the SDK must work without Flask.
"""

from __future__ import annotations

from typing import Any, ClassVar


class TokenError(Exception):
    """Base class of every error token-service reports."""

    code: ClassVar[str] = "token_error"
    status: ClassVar[int] = 500
    title: ClassVar[str] = "Token service error"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.title)
        self.detail = message or self.title


class InvalidRequest(TokenError):
    """The request breaks the schema; ``errors`` maps field → messages."""

    code = "invalid_request"
    status = 400
    title = "Invalid request"

    def __init__(self, message: str | None = None, errors: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or {}


class Unauthorized(TokenError):
    """Missing or wrong service key."""

    code = "unauthorized"
    status = 401
    title = "Unauthorized"


class TokenMismatch(TokenError):
    """Scope, subject or fingerprint differ; the token is not used up."""

    code = "token_mismatch"
    status = 403
    title = "Token does not match this operation"

    def __init__(self, message: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class TokenInvalid(TokenError):
    """Unknown, expired, revoked or malformed token (indistinguishable on purpose)."""

    code = "token_invalid"
    status = 404
    title = "Token invalid"


class TokenUsed(TokenError):
    """Already consumed or finished by another request."""

    code = "token_used"
    status = 409
    title = "Token already used"


class TokenInProgress(TokenError):
    """Another holder's lease is live; retry after ``retry_after_seconds``."""

    code = "token_in_progress"
    status = 409
    title = "Token in progress"

    def __init__(self, message: str | None = None, retry_after_seconds: int = 1) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class TokenFailed(TokenError):
    """A terminal failure was recorded; ``error`` is what the holder stored."""

    code = "token_failed"
    status = 409
    title = "Token failed"

    def __init__(self, message: str | None = None, error: Any = None) -> None:
        super().__init__(message)
        self.error = error


class LeaseLost(TokenError):
    """complete/fail with a lease that is not the live one (expired or taken over)."""

    code = "lease_lost"
    status = 409
    title = "Lease lost"


class PayloadTooLarge(TokenError):
    """The request body is over the configured limit."""

    code = "payload_too_large"
    status = 413
    title = "Payload too large"


class RateLimited(TokenError):
    """Issuance limit hit; retry after ``retry_after_seconds``."""

    code = "rate_limited"
    status = 429
    title = "Rate limited"

    def __init__(self, message: str | None = None, retry_after_seconds: int = 1) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class ServiceUnavailable(TokenError):
    """The store is unreachable; nothing is known to have happened (fail closed)."""

    code = "store_unavailable"
    status = 503
    title = "Store unavailable"

    def __init__(self, message: str | None = None, retry_after_seconds: int = 1) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


ERRORS_BY_CODE: dict[str, type[TokenError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest,
        Unauthorized,
        TokenMismatch,
        TokenInvalid,
        TokenUsed,
        TokenInProgress,
        TokenFailed,
        LeaseLost,
        PayloadTooLarge,
        RateLimited,
        ServiceUnavailable,
    )
}
