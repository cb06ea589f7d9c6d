"""The errors of the idempotency records in the business database (``token_service.client.durable``).

They subclass ``TokenError``, so ``problems.problem_for`` and the SDK's web
integrations answer them like any other; but they never travel over HTTP
as codes of the token API, so they are not in ``errors.ERRORS_BY_CODE``:
``code``/``status`` say how a backend would answer them.
"""

from __future__ import annotations

from typing import Any

from token_service.errors import TokenError


class RecordError(TokenError):
    """Base class of the errors of the idempotency records in the business database."""

    code = "record_error"
    status = 500
    title = "Idempotency record error"


class RecordInProgress(RecordError):
    """Another holder's lease on this record is live; retry after ``retry_after_seconds``."""

    code = "record_in_progress"
    status = 409
    title = "Request in progress"

    def __init__(self, message: str | None = None, key: str = "", retry_after_seconds: int = 1) -> None:
        super().__init__(message)
        self.key = key
        self.retry_after_seconds = retry_after_seconds


class RecordFailed(RecordError):
    """A terminal failure was recorded for this key; ``error`` is what the holder stored."""

    code = "record_failed"
    status = 409
    title = "Request failed"

    def __init__(self, message: str | None = None, key: str = "", error: Any = None) -> None:
        super().__init__(message)
        self.key = key
        self.error = error


class FingerprintMismatch(RecordError):
    """The key was first used for a different request (IETF Idempotency-Key: 422)."""

    code = "fingerprint_mismatch"
    status = 422
    title = "Key reused with a different request"

    def __init__(self, message: str | None = None, key: str = "") -> None:
        super().__init__(message)
        self.key = key


class RowNotFound(RecordError):
    """The row a transition or versioned update targets does not exist."""

    code = "row_not_found"
    status = 404
    title = "Row not found"

    def __init__(self, message: str | None = None, row_id: Any = None) -> None:
        super().__init__(message)
        self.row_id = row_id


class IllegalTransition(RecordError):
    """The state machine does not allow ``current`` → ``target``.

    ``current`` is None when the move was refused before touching the database
    (the target cannot be reached from any state, or from the state the caller
    said it expected). ``already`` is true when the row is in ``target`` already:
    a duplicate of a move that has happened, which callers often answer as a
    success.
    """

    code = "illegal_transition"
    status = 409
    title = "Illegal state transition"

    def __init__(
        self,
        message: str | None = None,
        row_id: Any = None,
        current: str | None = None,
        target: str = "",
        allowed_from: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__(message)
        self.row_id = row_id
        self.current = current
        self.target = target
        self.allowed_from = allowed_from

    @property
    def already(self) -> bool:
        return self.current is not None and self.current == self.target


class StaleVersion(RecordError):
    """Optimistic lock: the row's version is no longer ``expected`` (``actual`` is)."""

    code = "stale_version"
    status = 409
    title = "Stale version"

    def __init__(
        self, message: str | None = None, row_id: Any = None, expected: int = 0, actual: int | None = None
    ) -> None:
        super().__init__(message)
        self.row_id = row_id
        self.expected = expected
        self.actual = actual
