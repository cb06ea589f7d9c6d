"""The error tree: every error token-service reports, from the service, the SDK and the tools.

::

    TokenError                              code (status)
    ├── InvalidRequest                      invalid_request (400)
    │   └── IdempotencyKeyRepeated          idempotency_key_repeated (400)      [1]
    ├── IdempotencyIdentityRequired         idempotency_identity_required (400) [1]
    ├── IdempotencyKeyInUse                 idempotency_key_in_use (409, retry after) [1]
    ├── IdempotencyKeyMismatch              idempotency_key_mismatch (422)      [1]
    ├── Unauthorized                        unauthorized (401)
    ├── TokenMismatch                       token_mismatch (403)
    ├── TokenInvalid                        token_invalid (404)
    ├── TokenUsed                           token_used (409)
    ├── TokenInProgress                     token_in_progress (409, retry after)
    ├── TokenFailed                         token_failed (409)
    ├── LeaseLost                           lease_lost (409)
    ├── PayloadTooLarge                     payload_too_large (413)
    ├── RateLimited                         rate_limited (429, retry after)
    │   └── OutstandingCapReached           rate_limited (429): the cap; read back as RateLimited
    ├── ServiceUnavailable                  store_unavailable (503, retry after)
    ├── IssuancePaused                      issuance_paused (503, retry after)
    ├── OutcomeNotRecorded                  outcome_not_recorded (500)          [5]
    ├── RequestTimeout                      request_timeout (408)               [2]
    ├── RecordNotFound                      not_found (404)                     [3]
    ├── NotInProgress                       not_in_progress (409)               [3]
    ├── UnexpectedReply                     unexpected_reply (a reply, never sent) [6]
    └── RecordError                         record_error (500)                  [4]
        ├── RecordInProgress                record_in_progress (409)
        ├── RecordFailed                    record_failed (409)
        ├── FingerprintMismatch             fingerprint_mismatch (422)
        ├── RowNotFound                     row_not_found (404)
        ├── IllegalTransition               illegal_transition (409)
        └── StaleVersion                    stale_version (409)

The classes without a mark are the token API's error table (openapi.yaml,
docs/http-api.md), :data:`ERRORS_BY_CODE`: the SDK's HTTP transport turns a
problem document back into its class. The others are answered as problem
documents too but are not that table's: [1] the Idempotency-Key middlewares'
own answers (``client/_idempotency_core.py`` answers them, never raises them);
[2] the service's, a body that did not arrive in time (raised by
``server/body.py``); [3] the operators' tools' (``ops/admin.py``, the
``/admin/`` routes); [4] the durable records' in the business database
(``token_service.client.durable``, which re-exports those a caller catches); [5] the SDK's guards': the work
ran and its outcome could not be stored (``@require_token`` answers it as a 500); [6] the SDK's
own, never on the wire: its HTTP transport's verdict on a reply the API never sends
(``client/_replies.py``).

Every failure a caller can meet has one narrow class whose ``code`` is its
stable machine-readable code and whose ``status`` is the HTTP status it is
answered with. The SDK raises the very same classes, so a backend never
parses HTTP to learn what happened. This module imports nothing outside the
standard library: the SDK must work without Flask.

What an error adds to its problem document (``errors``, ``field``, ``error``,
``retry_after_seconds``) is said once, by the class's ``member``: :meth:`TokenError.problem_extras`
writes it (``problems.problem_for``), :meth:`TokenError.from_problem` reads it
back (the SDK's HTTP transport) through the class's own check, ``read_member``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = [
    "ERRORS_BY_CODE",
    "FingerprintMismatch",
    "IdempotencyIdentityRequired",
    "IdempotencyKeyInUse",
    "IdempotencyKeyMismatch",
    "IdempotencyKeyRepeated",
    "IllegalTransition",
    "InvalidRequest",
    "IssuancePaused",
    "LeaseLost",
    "NotInProgress",
    "OutcomeNotRecorded",
    "OutstandingCapReached",
    "PayloadTooLarge",
    "RateLimited",
    "RecordError",
    "RecordFailed",
    "RecordInProgress",
    "RecordNotFound",
    "RequestTimeout",
    "RowNotFound",
    "ServiceUnavailable",
    "StaleVersion",
    "TokenError",
    "TokenFailed",
    "TokenInProgress",
    "TokenInvalid",
    "TokenMismatch",
    "TokenUsed",
    "Unauthorized",
    "UnexpectedReply",
]


class TokenError(Exception):
    """Base class of every error token-service reports.

    ``token_ref``: over HTTP, the digest of the token the refused request named, as the
    service's problem document and access line carry it (what an operator finds the
    record by: ``token-service admin show <token_ref>``); None otherwise.
    """

    code: ClassVar[str] = "token_error"
    status: ClassVar[int] = 500
    title: ClassVar[str] = "Token service error"
    # the one member this error adds to its problem document (None: none): its attribute and
    # its constructor's keyword of that name
    member: ClassVar[str | None] = None
    token_ref: str | None = None

    def __init_subclass__(
        cls, *, code: str | None = None, status: int | None = None, title: str | None = None
    ) -> None:
        """Each error's code, status and title are said in its class line (``class
        TokenUsed(TokenError, code="token_used", status=409, title=...)``); what a subclass
        leaves out it keeps from its parent."""
        super().__init_subclass__()
        cls.code = code or cls.code
        cls.status = status or cls.status
        cls.title = title or cls.title

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.title)
        self.detail = message or self.title

    def problem_extras(self) -> dict[str, Any]:
        """The members this error adds to its problem document."""
        return {} if self.member is None else {self.member: getattr(self, self.member)}

    @classmethod
    def from_problem(cls, detail: str | None, document: Mapping[str, Any]) -> TokenError:
        """The error a problem document of this class's ``code`` stands for."""
        if cls.member is None:
            return cls(detail)
        return cls(detail, **{cls.member: cls.read_member(document.get(cls.member))})

    @staticmethod
    def read_member(value: Any) -> Any:
        """The member from what a problem document holds there (anything, or None: nothing)."""
        return value


class _RetryLater(TokenError):
    """An error that says when to try again: ``retry_after_seconds`` (and ``Retry-After``)."""

    member = "retry_after_seconds"

    def __init__(self, message: str | None = None, retry_after_seconds: int = 1) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds

    @staticmethod
    def read_member(value: Any) -> int:
        return value if type(value) is int and value >= 1 else 1


class InvalidRequest(TokenError, code="invalid_request", status=400, title="Invalid request"):
    """The request breaks the schema; ``errors`` maps field → messages."""

    member = "errors"

    def __init__(self, message: str | None = None, errors: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or {}

    @staticmethod
    def read_member(value: Any) -> dict[str, Any] | None:
        return value if isinstance(value, dict) else None


class IdempotencyKeyRepeated(
    InvalidRequest, code="idempotency_key_repeated", title="Several Idempotency-Keys"
):
    """A request to an Idempotency-Key middleware carried several keys: two header fields
    (which servers join with a comma), or one field listing two. The header is a single
    Structured Field string (draft-ietf-httpapi-idempotency-key-header); no key is chosen.

    The middlewares' own answer (a 400), never the token service's: not in ``ERRORS_BY_CODE``.
    """


class IdempotencyIdentityRequired(
    TokenError, code="idempotency_identity_required", status=400, title="Unidentified client"
):
    """A request to an Idempotency-Key middleware carried a key but no client identity: keys are
    kept per client, and anonymous clients would share one namespace (and each other's responses).

    The middlewares' own answer (a 400 without ``errors``), never the token service's."""


class IdempotencyKeyInUse(
    _RetryLater, code="idempotency_key_in_use", status=409, title="Request in progress"
):
    """An Idempotency-Key middleware's request with a key whose first request is still running
    (``Retry-After``). The middlewares' own answer, never the token service's."""


class IdempotencyKeyMismatch(
    TokenError, code="idempotency_key_mismatch", status=422, title="Idempotency-Key reused"
):
    """An Idempotency-Key middleware's key sent again with another request (another fingerprint).
    The middlewares' own answer (IETF draft: 422), never the token service's."""


class Unauthorized(TokenError, code="unauthorized", status=401, title="Unauthorized"):
    """Missing or wrong service key."""


class TokenMismatch(
    TokenError, code="token_mismatch", status=403, title="Token does not match this operation"
):
    """Scope, subject or fingerprint differ; the token is not used up."""

    member = "field"

    def __init__(self, message: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field

    def problem_extras(self) -> dict[str, Any]:
        return {"field": self.field} if self.field else {}  # a document's field is a name, never null

    @staticmethod
    def read_member(value: Any) -> str | None:
        return value if isinstance(value, str) else None


class TokenInvalid(TokenError, code="token_invalid", status=404, title="Token invalid"):
    """Unknown, expired, revoked or malformed token (indistinguishable on purpose)."""


class TokenUsed(TokenError, code="token_used", status=409, title="Token already used"):
    """Already consumed or finished by another request."""


class TokenInProgress(_RetryLater, code="token_in_progress", status=409, title="Token in progress"):
    """Another holder's lease is live; retry after ``retry_after_seconds``."""


class TokenFailed(TokenError, code="token_failed", status=409, title="Token failed"):
    """A terminal failure was recorded; ``error`` is what the holder stored."""

    member = "error"

    def __init__(self, message: str | None = None, error: Any = None) -> None:
        super().__init__(message)
        self.error = error


class LeaseLost(TokenError, code="lease_lost", status=409, title="Lease lost"):
    """complete/fail with a lease that is not the live one (expired or taken over)."""


class PayloadTooLarge(TokenError, code="payload_too_large", status=413, title="Payload too large"):
    """The request body is over the configured limit."""


class RateLimited(_RetryLater, code="rate_limited", status=429, title="Rate limited"):
    """Issuance limit hit; retry after ``retry_after_seconds``."""


class OutstandingCapReached(RateLimited):
    """Also ``429 rate_limited``; its own class so that metrics can tell the two limits apart."""


class ServiceUnavailable(_RetryLater, code="store_unavailable", status=503, title="Store unavailable"):
    """The store is unreachable; nothing is known to have happened (fail closed)."""


class IssuancePaused(_RetryLater, code="issuance_paused", status=503, title="Issuance paused"):
    """Anonymous issuance is refused for now, for every client: the budget of outstanding
    anonymous tokens is spent, or Redis is near its ``maxmemory``. Consumes and the two-phase
    calls keep working (the room is kept for them); retry after ``retry_after_seconds``.

    Not a :class:`ServiceUnavailable`: nothing is wrong with the store, nothing was issued,
    and the SDK does not retry it at once (the pause lasts until tokens are used or expire).
    """


class OutcomeNotRecorded(TokenError, code="outcome_not_recorded", status=500, title="Outcome not recorded"):
    """The guarded work ran, and its outcome could not be recorded: the store did not answer
    for as long as the lease could be held (the guard kept its lease renewed and tried again
    all that time).

    Not a :class:`ServiceUnavailable`, which means the work did *not* run: never retry this
    as if nothing had happened. To the token it is a crashed holder: the record stays
    PROCESSING until the lease runs out, and a duplicate that comes after that may run the
    work again (the durable backstop refuses it; the reconciler, ``ops/reconcile``, finishes
    such a record with what is carried here). ``operation`` is what was not recorded
    (``complete``, ``fail``: a terminal failure, or ``release``), ``result`` / ``error`` what
    it would have stored, ``token_ref`` the record's reference (``token-service admin show``),
    ``key`` a keyed operation's key (None for a token), ``lease_id`` the lease that ran it;
    ``__cause__`` is the store's last error. The message says the same, never the token.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        operation: str = "complete",
        scope: str = "",
        token_ref: str | None = None,
        key: Any = None,
        lease_id: str = "",
        result: Any = None,
        error: Any = None,
    ) -> None:
        super().__init__(message)
        self.operation = operation
        self.scope = scope
        self.token_ref = token_ref
        self.key = key
        self.lease_id = lease_id
        self.result = result
        self.error = error

    def problem_extras(self) -> dict[str, Any]:
        return {} if self.token_ref is None else {"token_ref": self.token_ref}


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
        IssuancePaused,
    )
}


# Not in the API's table (see the tree above): answered as problem documents, never read back.


class RequestTimeout(TokenError, code="request_timeout", status=408, title="Request timeout"):
    """The request body did not arrive in time (``TOKEN_SERVICE_BODY_TIMEOUT_SECONDS``)."""


class RecordNotFound(TokenError, code="not_found", status=404, title="Not found"):
    """Operators' tools: no record under that reference (never issued, expired, or deleted)."""


class NotInProgress(TokenError, code="not_in_progress", status=409, title="Not in progress"):
    """Operators' tools: release asked of a record that holds no operation in progress."""


# The SDK's own: raised by its HTTP transport about what it was sent, never sent itself.


class UnexpectedReply(TokenError, code="unexpected_reply", status=502, title="Not a token service's reply"):
    """The endpoint did not answer as a token service: a status the operation never answers
    with (a redirect, a 204, a 500), another media type (an HTML page), a body that is not
    the documented JSON (``{}``, a list, ``"replayed": "false"``) or one over the size cap.

    The SDK's HTTP transport raises it instead of guessing (never the token in it);
    ``reply_status`` and ``media_type`` are the reply's, ``reason`` what was wrong with it.
    Not retried: the same request to the same endpoint gets the same answer, and for a
    consume or begin nothing says whether the service ran it (fail closed).
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        reply_status: int | None = None,
        media_type: str | None = None,
        reason: str = "",
    ) -> None:
        super().__init__(message)
        self.reply_status = reply_status
        self.media_type = media_type
        self.reason = reason


# The idempotency records in the business database (token_service.client.durable): a backend
# answers them like any other TokenError, but they never travel over HTTP as codes of the token API.


class RecordError(TokenError, code="record_error", status=500, title="Idempotency record error"):
    """Base class of the errors of the idempotency records in the business database."""


class RecordInProgress(RecordError, code="record_in_progress", status=409, title="Request in progress"):
    """Another holder's lease on this record is live; retry after ``retry_after_seconds``."""

    def __init__(self, message: str | None = None, key: str = "", retry_after_seconds: int = 1) -> None:
        super().__init__(message)
        self.key = key
        self.retry_after_seconds = retry_after_seconds


class RecordFailed(RecordError, code="record_failed", status=409, title="Request failed"):
    """A terminal failure was recorded for this key; ``error`` is what the holder stored."""

    def __init__(self, message: str | None = None, key: str = "", error: Any = None) -> None:
        super().__init__(message)
        self.key = key
        self.error = error


class FingerprintMismatch(
    RecordError, code="fingerprint_mismatch", status=422, title="Key reused with a different request"
):
    """The key was first used for a different request (IETF Idempotency-Key: 422)."""

    def __init__(self, message: str | None = None, key: str = "") -> None:
        super().__init__(message)
        self.key = key


class RowNotFound(RecordError, code="row_not_found", status=404, title="Row not found"):
    """The row a transition or versioned update targets does not exist."""

    def __init__(self, message: str | None = None, row_id: Any = None) -> None:
        super().__init__(message)
        self.row_id = row_id


class IllegalTransition(RecordError, code="illegal_transition", status=409, title="Illegal state transition"):
    """The state machine does not allow ``current`` → ``target``.

    ``current`` is None when the move was refused before touching the database
    (the target cannot be reached from any state, or from the state the caller
    said it expected). ``already`` is true when the row is in ``target`` already:
    a duplicate of a move that has happened, which callers often answer as a
    success.
    """

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


class StaleVersion(RecordError, code="stale_version", status=409, title="Stale version"):
    """Optimistic lock: the row's version is no longer ``expected`` (``actual`` is)."""

    def __init__(
        self, message: str | None = None, row_id: Any = None, expected: int = 0, actual: int | None = None
    ) -> None:
        super().__init__(message)
        self.row_id = row_id
        self.expected = expected
        self.actual = actual
