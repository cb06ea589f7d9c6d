"""The error hierarchy shared by the store, the HTTP API and the SDK.

Every failure a caller can meet has one narrow class whose ``code`` is the
stable machine-readable code of the API's error table (openapi.yaml,
docs/http-api.md) and whose ``status`` is
the HTTP status the API answers with. The SDK raises the very same classes, so
a backend never parses HTTP to learn what happened. This module imports
nothing outside the standard library: the SDK must work without Flask.

What an error adds to its problem document (``errors``, ``field``, ``error``,
``retry_after_seconds``) is said once, by the class: :meth:`TokenError.problem_extras`
writes it (``problems.problem_for``), :meth:`TokenError.from_problem` reads it
back (the SDK's HTTP transport).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar


class TokenError(Exception):
    """Base class of every error token-service reports.

    ``token_ref``: over HTTP, the digest of the token the refused request named, as the
    service's problem document and access line carry it (what an operator finds the
    record by: ``token-service admin show <token_ref>``); None otherwise.
    """

    code: ClassVar[str] = "token_error"
    status: ClassVar[int] = 500
    title: ClassVar[str] = "Token service error"
    token_ref: str | None = None

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.title)
        self.detail = message or self.title

    def problem_extras(self) -> dict[str, Any]:
        """The members this error adds to its problem document."""
        return {}

    @classmethod
    def from_problem(cls, detail: str | None, document: Mapping[str, Any]) -> TokenError:
        """The error a problem document of this class's ``code`` stands for."""
        return cls(detail)


class _RetryLater(TokenError):
    """An error that says when to try again: ``retry_after_seconds`` (and ``Retry-After``)."""

    def __init__(self, message: str | None = None, retry_after_seconds: int = 1) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds

    def problem_extras(self) -> dict[str, Any]:
        return {"retry_after_seconds": self.retry_after_seconds}

    @classmethod
    def from_problem(cls, detail: str | None, document: Mapping[str, Any]) -> TokenError:
        value = document.get("retry_after_seconds")
        return cls(detail, retry_after_seconds=value if type(value) is int and value >= 1 else 1)


class InvalidRequest(TokenError):
    """The request breaks the schema; ``errors`` maps field → messages."""

    code = "invalid_request"
    status = 400
    title = "Invalid request"

    def __init__(self, message: str | None = None, errors: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or {}

    def problem_extras(self) -> dict[str, Any]:
        return {"errors": self.errors}

    @classmethod
    def from_problem(cls, detail: str | None, document: Mapping[str, Any]) -> TokenError:
        errors = document.get("errors")
        return cls(detail, errors if isinstance(errors, dict) else None)


class IdempotencyKeyRepeated(InvalidRequest):
    """A request to an Idempotency-Key middleware carried several keys: two header fields
    (which servers join with a comma), or one field listing two. The header is a single
    Structured Field string (draft-ietf-httpapi-idempotency-key-header); no key is chosen.

    The middlewares' own answer (a 400), never the token service's: not in ``ERRORS_BY_CODE``.
    """

    code = "idempotency_key_repeated"
    title = "Several Idempotency-Keys"


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

    def problem_extras(self) -> dict[str, Any]:
        return {"field": self.field} if self.field else {}

    @classmethod
    def from_problem(cls, detail: str | None, document: Mapping[str, Any]) -> TokenError:
        field = document.get("field")
        return cls(detail, field=field if isinstance(field, str) else None)


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


class TokenInProgress(_RetryLater):
    """Another holder's lease is live; retry after ``retry_after_seconds``."""

    code = "token_in_progress"
    status = 409
    title = "Token in progress"


class TokenFailed(TokenError):
    """A terminal failure was recorded; ``error`` is what the holder stored."""

    code = "token_failed"
    status = 409
    title = "Token failed"

    def __init__(self, message: str | None = None, error: Any = None) -> None:
        super().__init__(message)
        self.error = error

    def problem_extras(self) -> dict[str, Any]:
        return {"error": self.error}

    @classmethod
    def from_problem(cls, detail: str | None, document: Mapping[str, Any]) -> TokenError:
        return cls(detail, error=document.get("error"))


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


class RateLimited(_RetryLater):
    """Issuance limit hit; retry after ``retry_after_seconds``."""

    code = "rate_limited"
    status = 429
    title = "Rate limited"


class ServiceUnavailable(_RetryLater):
    """The store is unreachable; nothing is known to have happened (fail closed)."""

    code = "store_unavailable"
    status = 503
    title = "Store unavailable"


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
