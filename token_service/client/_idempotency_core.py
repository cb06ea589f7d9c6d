"""The decisions of ``Idempotency-Key`` handling, once, for every framework (what a request gets:
docs/integrations/wsgi-middleware.md).

The WSGI, ASGI and Django middlewares only move bytes, calling in turn: :meth:`~IdempotencyCore.screen`
(is the request guarded, is its key valid), :meth:`~IdempotencyCore.attempt` (who asks: keys are per
client; the fingerprint; a fresh owner id), :meth:`~IdempotencyCore.claim` (``None``: this request holds
the key; else the answer: a replay, 409, 422, 503 — fail closed), the app inside
:meth:`~IdempotencyCore.hold` (the claim renewed, so a slow request keeps its key), a
:meth:`~IdempotencyCore.recorder` watching the response go out (its body kept up to a cap, never
buffered whole), then :meth:`~IdempotencyCore.settle` inside ``hold``: store the response, fenced by
the owner id, or free the key. A store that cannot answer is tried again while the claim can be held
(``_renewal.settle_pause``, the guards' rule); past that, an OutcomeNotRecorded the adapters break the
response off with. Claim, renewal and settle are flows (:mod:`._engine`): ``a...`` drives them async.
The WSGI and ASGI middlewares share :class:`Middleware` (their options, store and admitting flow)
and :class:`Relay` (a response on its way out, settled once).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, Unpack

from token_service import defaults, errors
from token_service.client._engine import Flow, drive, drive_async
from token_service.client._fingerprint import RequestFacts, fingerprint_request
from token_service.client._idempotency_options import IdempotencyOptionArgs, IdempotencyOptions, options_of
from token_service.client._idempotency_store import (
    AsyncIdempotencyStore,
    Claimed,
    IdempotencyStore,
    InProgress,
    Legacy,
    Mismatch,
    Outcome,
    _no_legacy,
)
from token_service.client._renewal import AsyncLeaseRenewer, LeaseRenewer, interval_for, settle_pause
from token_service.client._stored_response import (
    CREDENTIAL_REFUSALS,
    OMITTED_HEADER,
    REPLAYED_HEADER,
    StoredResponse,
)
from token_service.client._telemetry import DEFAULT_TELEMETRY, IDEMPOTENCY_SPAN_NAME, GuardSpan
from token_service.problems import problem_for
from token_service.tokens import whole_number


def declared_length(header: str) -> int | None:
    """A Content-Length's value as a number, or None when absent or not a number: every one the SDK
    reads goes through here (servers differ in the malformed ones they let through to the app)."""
    return whole_number(header.strip())


# the name the WSGI middleware's module had until 0.2.0 (now client/wsgi.py): kept, so a
# logging config written for it still reaches all three middlewares
log = logging.getLogger("token_service.client.idempotency")

MAX_KEY_CHARS = 255
# how often a waiting duplicate looks at the record again (doubling from the first)
_FIRST_PAUSE_SECONDS = 0.025
_MAX_PAUSE_SECONDS = 0.25
# Never replayed: they describe one connection or one moment, or belong to one session.
NOT_STORED_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-authenticate",
        "date",
        "server",
        "set-cookie",
        REPLAYED_HEADER.lower(),
    }
)

AppT = TypeVar("AppT")
RequestT = TypeVar("RequestT")
StoreT = TypeVar("StoreT", IdempotencyStore, AsyncIdempotencyStore)
RenewerT = TypeVar("RenewerT", LeaseRenewer, AsyncLeaseRenewer)
# what a claim's span says of a request refused without running
_REFUSED_AS = {StoredResponse: "replayed", InProgress: "conflict", Mismatch: "mismatch"}

__all__ = [
    "MAX_KEY_CHARS",
    "Answer",
    "Attempt",
    "BodyEndedEarly",
    "IdempotencyCore",
    "Middleware",
    "Recorder",
    "Relay",
    "declared_length",
    "parse_key",
]


@dataclass(frozen=True, slots=True)
class Answer:
    """A complete response the middleware sends instead of running the app."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    replayed: bool = False


@dataclass(slots=True, eq=False)
class Attempt:
    """One request's claim on a key: the record, what it must match, who holds it and since when."""

    record: str
    fingerprint: str
    owner: str
    # the fingerprint earlier versions computed (raw body bytes), computed only for such a record
    legacy: Legacy = _no_legacy
    # its OpenTelemetry span (IDEMPOTENCY_SPAN_NAME): from the claim to the answer or the settle
    span: GuardSpan = field(default_factory=lambda: GuardSpan(None))
    body: bytes = b""  # the request's, read whole before the claim (the ASGI app is handed it again)
    # when (time.monotonic()) the last claim or renewal the store acknowledged was sent: the
    # claim holds lock_seconds from then (what the settle's retries are bounded by)
    held_from: float = 0.0
    # set while the outcome is stored: a renewal refused then is for the store's reply to judge
    settling: bool = False


@dataclass(slots=True)
class Recorder:
    """Watches one response go out; keeps its body up to ``cap`` bytes, counts the rest."""

    status: int
    headers: list[tuple[str, str]]
    cap: int
    storable: bool
    length: int | None = None  # the declared Content-Length, if any
    size: int = 0
    complete: bool = False
    failed: bool = False
    _chunks: list[bytes] | None = field(default_factory=list)

    def feed(self, chunk: bytes) -> bool:
        """Record ``chunk``; True when it completes a body of declared length (settle before sending it:
        a client that has the whole response may send its duplicate at once)."""
        self.size += len(chunk)
        if self._chunks is not None and self.storable:
            if self.size > self.cap:
                self._chunks = None  # over the cap: from here on only counted, never held
            elif chunk:
                self._chunks.append(bytes(chunk))
        if self.length is not None and self.size >= self.length:
            self.complete = True
        return self.complete

    def stored(self) -> StoredResponse | None:
        """What duplicates get, or None: nothing worth keeping (the key is freed)."""
        if not self.storable or self.failed:
            return None
        kept = [(name, value) for name, value in self.headers if name.lower() not in NOT_STORED_HEADERS]
        if self._chunks is None or not self.complete:
            # over the cap, or the client left mid-body: the work is done, the body not kept
            kept = [(n, v) for n, v in kept if n.lower() not in ("content-length", OMITTED_HEADER.lower())]
            return StoredResponse(self.status, b"", kept, omitted=self.size)
        body = b"".join(self._chunks)
        self._chunks = [body]  # the pieces go: the body is held once (join of one bytes returns it)
        return StoredResponse(self.status, body, kept)


def _legacy_fingerprint(facts: RequestFacts) -> str | None:
    """The fingerprint versions before the shared one used (method, path, query, raw body), read only
    for a record that does not match the current one: a retry across an upgrade is replayed, not 422."""
    hasher = hashlib.sha256()
    try:
        for part in (
            facts.method.upper().encode(),
            facts.path.encode("latin-1"),
            facts.query.encode("latin-1"),
        ):
            hasher.update(part + b"\n")
    except UnicodeEncodeError:
        return None  # no earlier version could have written it
    hasher.update(facts.body)
    return base64.urlsafe_b64encode(hasher.digest()).rstrip(b"=").decode("ascii")


def _string_end(value: str) -> int:
    """Where the sf-string that ``value`` starts with closes (RFC 8941 4.2.5: ``\\"`` and
    ``\\\\`` are escapes), or -1 when it never does."""
    index = 1
    while index < len(value):
        if value[index] == "\\":
            index += 2
            continue
        if value[index] == '"':
            return index
        index += 1
    return -1


def several_keys(raw: str) -> bool:
    """Whether the header's value is a list of keys: a server joins a repeated header's fields with a
    comma, so a comma outside one sf-string's quotes (or in a bare key) means several."""
    value = raw.strip()
    if value.startswith('"'):
        end = _string_end(value)
        return end != -1 and value[end + 1 :].lstrip(" \t").startswith(",")
    return "," in value


def parse_key(raw: str, max_chars: int = MAX_KEY_CHARS) -> str | None:
    """The key from the header: an sf-string (``"..."``, nothing after its closing quote) or a bare
    token; the text between the quotes as sent (escapes kept), as every earlier version stored it."""
    value = raw.strip()
    if value.startswith('"'):
        if _string_end(value) != len(value) - 1:
            return None  # no closing quote, or something after it
        value = value[1:-1]
    if not 1 <= len(value) <= max_chars or not value.isascii() or not value.isprintable():
        return None
    return value


class IdempotencyCore:
    """The decisions of one Idempotency-Key middleware on its :class:`IdempotencyOptions` (see the
    module docs)."""

    def __init__(
        self, options: IdempotencyOptions | None = None, **overrides: Unpack[IdempotencyOptionArgs]
    ) -> None:
        self.options = options_of(options, overrides)
        # counted under the SDK's counters (executions, replays, ...), scope = telemetry_scope
        self.telemetry = self.options.telemetry or DEFAULT_TELEMETRY

    # -- before the app ------------------------------------------------------------------

    def screen(self, method: str, raw_key: str | None) -> str | Answer | None:
        """The key (guard the request), an answer (refuse it) or None (not guarded: just run it)."""
        if method.upper() not in self.options.methods:
            return None
        if raw_key is None or not raw_key.strip():
            if not self.options.required:
                return None
            return self._bad_key(errors.InvalidRequest, "The {} header is required.", "Missing.")
        if several_keys(raw_key):
            # two Idempotency-Key fields: no key is chosen (and "A, B" is not a third one)
            why = "One key (an sf-string), not a list or a repeated header."
            return self._bad_key(errors.IdempotencyKeyRepeated, "Send one {} header with one key.", why)
        key = parse_key(raw_key)
        if key is None:
            why = f"1-{MAX_KEY_CHARS} printable ASCII characters."
            return self._bad_key(errors.InvalidRequest, "The {} header is not a valid key.", why)
        return key

    def _bad_key(self, error: type[errors.InvalidRequest], detail: str, why: str) -> Answer:
        header = self.options.header
        return self.problem(error(detail.format(header), {header: [why]}))

    def too_large(self) -> Answer:
        return self.problem(errors.PayloadTooLarge("The request body is over the limit."))

    def truncated(self) -> Answer:
        """The body ended before its Content-Length: a 400, and the key stays unclaimed."""
        return self.problem(errors.InvalidRequest("The body ended before its Content-Length."))

    def attempt(
        self,
        store: IdempotencyStore | AsyncIdempotencyStore,
        identity: str | None,
        key: str,
        facts: RequestFacts,
    ) -> Attempt | Answer:
        if not identity:
            # anonymous clients would share one namespace and get each other's responses
            return self.problem(
                errors.IdempotencyIdentityRequired(
                    f"An {self.options.header} is kept per client: send the request with your credentials."
                )
            )
        return Attempt(
            store.key(identity, key),
            fingerprint_request(facts, self.options.fingerprint),
            secrets.token_urlsafe(12),
            functools.partial(_legacy_fingerprint, facts) if self.options.fingerprint is None else _no_legacy,
            self.telemetry.start_span(
                self.options.telemetry_scope,
                is_async=isinstance(store, AsyncIdempotencyStore),
                name=IDEMPOTENCY_SPAN_NAME,
            ),
            facts.body,
        )

    def claim(self, store: IdempotencyStore, attempt: Attempt) -> Answer | None:
        """None: this request holds the key and runs. Else what to answer instead (a duplicate of a
        request still running waits up to ``wait_seconds`` for its response, polling, then gets 409)."""
        return drive(self.claiming(store, attempt))

    async def aclaim(self, store: AsyncIdempotencyStore, attempt: Attempt) -> Answer | None:
        return await drive_async(self.claiming(store, attempt))

    def claiming(
        self, store: IdempotencyStore | AsyncIdempotencyStore, attempt: Attempt
    ) -> Flow[Answer | None]:
        deadline = time.monotonic() + self.options.wait_seconds
        pause = _FIRST_PAUSE_SECONDS
        while True:
            attempt.held_from = time.monotonic()
            try:
                outcome = yield from store.beginning(
                    attempt.record,
                    attempt.fingerprint,
                    attempt.owner,
                    self.options.lock_seconds,
                    attempt.legacy,
                )
            except (errors.TokenError, ValueError, KeyError, TypeError) as exc:
                return self._refused(attempt, "error", self.store_failed(exc), exc)
            left = deadline - time.monotonic()
            if not isinstance(outcome, InProgress) or left <= 0:
                answer = self.decide(outcome)
                if answer is None:
                    attempt.span.set_outcome("executed")  # until settle says otherwise
                    return None
                return self._refused(attempt, _REFUSED_AS[type(outcome)], answer)
            yield min(pause, left)
            pause = min(pause * 2, _MAX_PAUSE_SECONDS)

    @staticmethod
    def _refused(
        attempt: Attempt, outcome: str, answer: Answer, error: BaseException | None = None
    ) -> Answer:
        """A refused attempt's span ends with its answer (a claimed one's at settle)."""
        attempt.span.set_outcome(outcome)
        if error is not None:
            attempt.span.record_error(error)
        attempt.span.end()
        return answer

    def decide(self, outcome: Outcome) -> Answer | None:
        """What the claim's outcome answers (counted): None for a claim, else a replay, 409 or 422."""
        if isinstance(outcome, Claimed):
            return None
        if isinstance(outcome, StoredResponse):
            self._count("replays")
            return Answer(outcome.status, outcome.replay_headers(), outcome.body, replayed=True)
        if isinstance(outcome, InProgress):
            self._count("conflicts", code=errors.IdempotencyKeyInUse.code)
            detail = f"A request with this {self.options.header} is still being processed; retry later."
            return self.problem(errors.IdempotencyKeyInUse(detail, outcome.retry_after_seconds))
        self._count("mismatches", field="fingerprint")
        return self.problem(
            errors.IdempotencyKeyMismatch(f"This {self.options.header} was used for a different request.")
        )

    def _count(self, name: str, **labels: str) -> None:
        self.telemetry.count(name, self.options.telemetry_scope, **labels)

    def store_failed(self, exc: BaseException) -> Answer:
        """Fail closed: the request does not run unguarded."""
        self._count("store_errors", operation="begin")
        if isinstance(exc, errors.ServiceUnavailable):
            return self.problem(exc)
        # the store refused the record (not an idempotency record, unreadable)
        log.error("the idempotency store refused a request: %s", exc)
        return self.problem(
            errors.ServiceUnavailable(
                "The idempotency store could not handle this key; the request did not run."
            )
        )

    def problem(self, error: errors.TokenError) -> Answer:
        status, headers, body = problem_for(error)
        return Answer(status, [*headers.items(), ("Content-Length", str(len(body)))], body)

    # -- while the app runs ----------------------------------------------------------------

    def hold(self, store: IdempotencyStore, attempt: Attempt) -> AbstractContextManager[Any]:
        """The app runs (and its body streams) inside this, the one place a request holds the key: its
        claim renewed every third of ``lock_seconds``. Call :meth:`settle` inside it, so the claim
        stays held while its outcome is stored (and tried again)."""
        return _held(self._renewer(LeaseRenewer, lambda: drive(self._renewing(store, attempt)), attempt))

    def ahold(self, store: AsyncIdempotencyStore, attempt: Attempt) -> AbstractAsyncContextManager[Any]:
        return _aheld(
            self._renewer(AsyncLeaseRenewer, lambda: drive_async(self._renewing(store, attempt)), attempt)
        )

    def _renewer(self, kind: type[RenewerT], renew: Callable[[], Any], attempt: Attempt) -> RenewerT:
        lost = functools.partial(self._claim_lost, attempt)
        return kind(renew, interval_for(self.options.lock_seconds), on_lost=lost)

    def _renewing(self, store: IdempotencyStore | AsyncIdempotencyStore, attempt: Attempt) -> Flow[None]:
        sent_at = time.monotonic()
        if not (yield from store.renewing(attempt.record, attempt.owner, self.options.lock_seconds)):
            raise errors.LeaseLost("the Idempotency-Key's claim ran out or was taken over")
        attempt.held_from = max(attempt.held_from, sent_at)

    def _claim_lost(self, attempt: Attempt, exc: errors.TokenError) -> None:
        if attempt.settling:
            return  # a renewal sent as the response was stored (or freed) is refused: no loss
        log.error("an idempotent request lost its claim on its key while it ran: %s", exc)
        self._count("lease_losses")
        attempt.span.add_event("lease_lost")

    def recorder(self, status: int, headers: Iterable[tuple[str, str]]) -> Recorder:
        headers = list(headers)
        length = declared_length(next((v for n, v in headers if n.lower() == "content-length"), ""))
        # a refusal of the credentials the key was claimed under is no result, whatever the policy
        storable = status not in CREDENTIAL_REFUSALS and self.options.store_status(status)
        cap = self.options.max_stored_bytes
        if 400 <= status < 500:
            cap = min(cap, self.options.max_stored_4xx_bytes)
        return Recorder(status, headers, cap, storable, length)

    # -- after the app ---------------------------------------------------------------------

    def settle(
        self, store: IdempotencyStore, attempt: Attempt, recorder: Recorder | None
    ) -> errors.OutcomeNotRecorded | None:
        """Store what duplicates get, or free the key (inside :meth:`hold`). Raises no store error:
        past the claim, the response that could not be kept is returned as an OutcomeNotRecorded."""
        return drive(self._settling(store, attempt, recorder))

    async def asettle(
        self, store: AsyncIdempotencyStore, attempt: Attempt, recorder: Recorder | None
    ) -> errors.OutcomeNotRecorded | None:
        return await drive_async(self._settling(store, attempt, recorder))

    def _settling(
        self, store: IdempotencyStore | AsyncIdempotencyStore, attempt: Attempt, recorder: Recorder | None
    ) -> Flow[errors.OutcomeNotRecorded | None]:
        stored = recorder.stored() if recorder is not None else None
        attempt.settling = True
        lock_seconds = self.options.lock_seconds
        failures = 0
        while True:
            try:
                if stored is None:
                    yield from store.releasing(attempt.record, attempt.owner)
                    self._ended(attempt, "released")
                    return None
                kept = yield from store.storing(
                    attempt.record, attempt.fingerprint, attempt.owner, stored, self.options.ttl_seconds
                )
                self._stored(attempt, kept, unknown=failures > 0)
                return None
            except errors.ServiceUnavailable as exc:
                failures += 1
                pause = settle_pause(
                    attempt.held_from + lock_seconds - time.monotonic(), lock_seconds, failures
                )
                if pause is None:
                    return self._settle_failed(attempt, stored, exc)
                yield pause
            except errors.TokenError as exc:
                return self._settle_failed(attempt, stored, exc)

    def not_recorded(self, exc: errors.OutcomeNotRecorded) -> Answer:
        """What a client gets instead of a response that could not be kept (Django's middleware;
        the WSGI and ASGI ones break the response off): a 500 ``outcome_not_recorded``."""
        return self.problem(
            errors.OutcomeNotRecorded(
                "The request ran, but its response could not be recorded: the idempotency store did "
                f"not answer. Do not send it again as a new request: with this {self.options.header} "
                "a retry is refused (409) while the request's claim lasts, and may run it again after that.",
                operation=exc.operation,
                scope=exc.scope,
            )
        )

    def _ended(self, attempt: Attempt, outcome: str, error: BaseException | None = None) -> None:
        self._count("executions", outcome=outcome)
        attempt.span.set_outcome("executed" if outcome == "succeeded" else outcome)
        if error is not None:
            attempt.span.record_error(error)
        attempt.span.end()

    def _stored(self, attempt: Attempt, kept: bool, *, unknown: bool) -> None:
        self._ended(attempt, "succeeded" if kept else "lease_lost")
        if not kept and unknown:
            # an earlier try's reply was lost: it may be that try which stored it
            log.warning("an idempotent response was stored by a try whose reply was lost, or not at all")
        elif not kept:
            log.warning(
                "an idempotent request outlived its %d s lock; its response was not stored",
                self.options.lock_seconds,
            )

    def _settle_failed(
        self, attempt: Attempt, stored: StoredResponse | None, exc: errors.TokenError
    ) -> errors.OutcomeNotRecorded | None:
        self._ended(attempt, "error", exc)
        down = isinstance(exc, errors.ServiceUnavailable)
        if down:
            self._count("store_errors", operation="release" if stored is None else "store")
        if stored is None or not down:
            # a claim not freed runs out by itself after lock_seconds
            what = "free an Idempotency-Key" if stored is None else "store an idempotent response"
            log.error("could not %s: %s", what, exc)
            return None
        ref = attempt.record.rsplit(":", 1)[-1]
        not_recorded = errors.OutcomeNotRecorded(
            f"An idempotent request ran, but its response ({stored.status}) could not be recorded: the "
            f"store did not answer while its {self.options.lock_seconds} s claim could be held (record "
            f"{ref}, claim {attempt.owner}; last error: {exc}). To the key this is a crashed holder: "
            "once the claim runs out a retry with it runs the request again. Reconcile it: "
            f"token-service admin show {ref}.",
            operation="complete",
            scope=self.options.telemetry_scope,
            token_ref=ref,
            lease_id=attempt.owner,
            result={"status": stored.status},
        )
        not_recorded.__cause__ = exc
        log.error("%s", not_recorded)
        return not_recorded


@contextlib.contextmanager
def _held(renewer: LeaseRenewer) -> Iterator[LeaseRenewer]:
    renewer.start()
    try:
        yield renewer
    finally:
        # the outcome is stored (or given up) inside the block: a renewal in flight now lands on a
        # settled record and is refused, so nothing waits for it
        renewer.stop(timeout_seconds=0)


@contextlib.asynccontextmanager
async def _aheld(renewer: AsyncLeaseRenewer) -> AsyncIterator[AsyncLeaseRenewer]:
    renewer.start()
    try:
        yield renewer
    finally:
        await renewer.stop()


class BodyEndedEarly(Exception):
    """The request body ended before it was whole (the client sent less than its Content-Length,
    or left mid-body)."""


class Middleware(Generic[AppT, RequestT, StoreT]):
    """What the WSGI and ASGI middlewares share: the core on its options, the store (made on the
    Redis client given), ``applies`` and ``identity`` (called with the request: environ or scope)."""

    store_class: type[StoreT]
    default_identity: Callable[[RequestT], str | None]

    def __init__(
        self,
        app: AppT,
        store: StoreT | Any,
        *,
        options: IdempotencyOptions | None = None,
        applies: Callable[[RequestT], bool] | None = None,
        identity: Callable[[RequestT], str | None] | None = None,
        key_prefix: str = defaults.KEY_PREFIX,
        **overrides: Unpack[IdempotencyOptionArgs],
    ) -> None:
        # the options by name (ttl_seconds=60, ...) on top of options=: one value for the core
        self.core = IdempotencyCore(options, **overrides)
        self.app = app
        self.store: StoreT = (
            store if isinstance(store, self.store_class) else self.store_class(store, key_prefix=key_prefix)
        )
        self.applies = applies
        self.identity = identity or self.default_identity

    def admitting(
        self,
        request: RequestT,
        key: str,
        read_body: Callable[[], Any],
        facts: Callable[[bytes], RequestFacts],
    ) -> Flow[Attempt | Answer]:
        """A screened request up to its app: the attempt that holds its key, or the answer instead.
        ``read_body`` returns the whole body (None over ``max_body_bytes``; :class:`BodyEndedEarly`
        short of it: the key stays unclaimed)."""
        core = self.core
        try:
            body = yield read_body
        except BodyEndedEarly:
            return core.truncated()
        if body is None:
            return core.too_large()
        attempt = core.attempt(self.store, self.identity(request), key, facts(body))
        if isinstance(attempt, Answer):
            return attempt
        answer = yield from core.claiming(self.store, attempt)
        return attempt if answer is None else answer


class Relay(Generic[StoreT]):
    """A claimed request's response on its way out (the WSGI and ASGI middlewares'): passed
    through, recorded, then settled once, while the key is held."""

    settled = False
    recorder: Recorder | None = None

    def __init__(self, middleware: Middleware[Any, Any, StoreT], attempt: Attempt) -> None:
        self.core = middleware.core
        self.store: StoreT = middleware.store
        self.app = middleware.app
        self.attempt = attempt

    def _settles(self, failed: bool) -> bool:
        """True the first time only: settle now (a failed response is not kept)."""
        if self.settled:
            return False
        self.settled = True
        if failed and self.recorder is not None:
            self.recorder.failed = True
        return True
