"""The decisions of ``Idempotency-Key`` handling, once, for every framework.

The WSGI middleware (:mod:`token_service.client.wsgi`), the ASGI one
(:mod:`token_service.client.asgi`) and the framework integrations only move
bytes; what to answer is decided here:

1. :meth:`IdempotencyCore.screen`: is this request guarded, and is its key
   valid (missing → 400 when ``required``, malformed → 400)?
2. :meth:`IdempotencyCore.attempt`: who is asking (no identity → 400
   ``idempotency_identity_required``), the request's fingerprint, the record
   key (per client), a fresh owner id for this attempt.
3. :meth:`IdempotencyCore.claim` / :meth:`aclaim`: one plain SET (a keyed
   claim on the common record; ``begin.lua`` on its rare paths). Returns
   ``None`` (this request holds the key: run the app) or the answer: the
   stored response with ``Idempotent-Replayed: true``, 409 with
   ``Retry-After`` (still running), 422 (the key was used for another
   request), 503 (the store failed: the request does not run unguarded).
4. The app runs inside ``with core.hold(store, attempt):`` (``async with
   core.ahold(...)``): the one place where a request holds the key, its
   claim renewed in the background meanwhile (a request slower than
   ``lock_seconds`` keeps its key; a dead process stops renewing).
5. :meth:`IdempotencyCore.recorder` watches the response go out: it keeps
   the body up to ``max_stored_bytes`` (a 4xx's up to ``max_stored_4xx_bytes``)
   and only counts the rest (a 64 MB stream passes through, never buffered
   whole). :meth:`settle` / :meth:`asettle` then store it (the status is one
   ``store_status`` keeps; a body over the cap is stored as omitted) or free the
   key (a 5xx, 408/409/425/429, 401/403/407 whatever ``store_status`` says, an
   exception, a response that never started). Storing is fenced by the
   attempt's owner id: an attempt that outlived its lock never overwrites a
   later attempt's record. Call them inside ``hold``: the claim stays renewed
   while the outcome is stored, and a store that cannot answer is tried again
   for as long as the claim can be held (``_renewal.settle_pause``, the guards'
   rule). Past that, :meth:`settle` returns an
   :class:`~token_service.errors.OutcomeNotRecorded` (logged with what
   reconciling it takes): the adapters break the response off before its end
   (Django's middleware, which settles before it answers, answers
   :meth:`not_recorded` instead). A release that cannot be stored is logged:
   the claim runs out by itself.
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
from http import HTTPStatus
from typing import Any, Unpack

from token_service.client._engine import Flow, drive, drive_async
from token_service.client._fingerprint import RequestFacts, fingerprint_request
from token_service.client._idempotency_options import IdempotencyOptionArgs, IdempotencyOptions, options_of
from token_service.client._idempotency_store import (
    AsyncIdempotencyStore,
    Claimed,
    IdempotencyStore,
    InProgress,
    Mismatch,
    Outcome,
)
from token_service.client._renewal import AsyncLeaseRenewer, LeaseRenewer, interval_for, settle_pause
from token_service.client._stored_response import (
    CREDENTIAL_REFUSALS,
    OMITTED_HEADER,
    REPLAYED_HEADER,
    StoredResponse,
)
from token_service.client._telemetry import DEFAULT_TELEMETRY, IDEMPOTENCY_SPAN_NAME, GuardSpan
from token_service.errors import (
    IdempotencyIdentityRequired,
    IdempotencyKeyInUse,
    IdempotencyKeyMismatch,
    IdempotencyKeyRepeated,
    InvalidRequest,
    LeaseLost,
    OutcomeNotRecorded,
    PayloadTooLarge,
    ServiceUnavailable,
    TokenError,
)
from token_service.problems import problem_for
from token_service.tokens import whole_number


def declared_length(header: str) -> int | None:
    """A Content-Length header's value as a number, or None when it is absent or not a number.

    Servers differ in what they let through to the app (gunicorn and uvicorn refuse a
    malformed one, Django's development server does not): every Content-Length the SDK reads
    goes through here (the WSGI, ASGI and Django middlewares, the Django and FastAPI
    ``require_token``); the service reads its own in :mod:`token_service.server.body`.
    """
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

__all__ = [
    "MAX_KEY_CHARS",
    "OMITTED_HEADER",
    "REPLAYED_HEADER",
    "Answer",
    "Attempt",
    "IdempotencyCore",
    "Recorder",
    "parse_key",
    "status_line",
]


@dataclass(frozen=True, slots=True)
class Answer:
    """A complete response the middleware sends instead of running the app."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    replayed: bool = False


@dataclass(slots=True)
class ClaimClock:
    """How long an attempt holds its key: what the settle's retries are bounded by."""

    # when (time.monotonic()) the last claim or renewal the store acknowledged was sent: the
    # claim holds lock_seconds from then
    held_from: float = 0.0
    # set while the outcome is stored: a renewal refused then is for the store's reply to judge
    settling: bool = False


@dataclass(frozen=True, slots=True)
class Attempt:
    """One request's claim on a key: the record, what it must match, and who holds it."""

    record: str
    fingerprint: str
    owner: str
    # the fingerprint earlier versions computed (raw body bytes), for their records still live:
    # computed only when such a record is found
    legacy: Callable[[], str | None] = field(default=lambda: None, compare=False)
    # its OpenTelemetry span (IDEMPOTENCY_SPAN_NAME): from the claim to the answer or the settle
    span: GuardSpan = field(default_factory=lambda: GuardSpan(None), compare=False)
    # how long it is held (changed by the claim, its renewals and the settle)
    clock: ClaimClock = field(default_factory=lambda: ClaimClock(), compare=False)


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
    """The fingerprint versions before the shared one used (method, path, query, raw body; base64url).

    Only read when a key's record does not match the current fingerprint, so a
    retry across an upgrade is replayed, not refused with 422, for one
    ``ttl_seconds`` after it; no record is left under it.
    """
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


def _no_legacy() -> None:
    return None  # a chosen fingerprint: no earlier version computed it otherwise


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
    """Whether the header's value is a list of keys, not one.

    A server joins the fields of a repeated header with a comma (gunicorn ``A,B``,
    others and ASGI here ``A, B``), so two fields arrive as one value; one sf-string
    (``"A, B"``) holds its commas inside its quotes and is a single key. A bare key
    (the form accepted beside the draft's sf-string) holding a comma is read as a list.
    """
    value = raw.strip()
    if value.startswith('"'):
        end = _string_end(value)
        return end != -1 and value[end + 1 :].lstrip(" \t").startswith(",")
    return "," in value


def parse_key(raw: str, max_chars: int = MAX_KEY_CHARS) -> str | None:
    """The key from the header: an sf-string (``"..."``, nothing after its closing quote);
    a bare token is accepted too. The key is the text between the quotes as sent (escapes
    kept), as every earlier version stored it."""
    value = raw.strip()
    if value.startswith('"'):
        if _string_end(value) != len(value) - 1:
            return None  # no closing quote, or something after it
        value = value[1:-1]
    if not 1 <= len(value) <= max_chars or not value.isascii() or not value.isprintable():
        return None
    return value


def status_line(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Unknown"


def _answer(document: tuple[int, dict[str, str], bytes]) -> Answer:
    status, headers, body = document
    return Answer(status, [*headers.items(), ("Content-Length", str(len(body)))], body)


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
            return self.problem(
                InvalidRequest(
                    f"The {self.options.header} header is required.", {self.options.header: ["Missing."]}
                )
            )
        if several_keys(raw_key):
            # two Idempotency-Key fields: no key is chosen (and "A, B" is not a third one)
            return self.problem(
                IdempotencyKeyRepeated(
                    f"Send one {self.options.header} header with one key.",
                    {self.options.header: ["One key (an sf-string), not a list or a repeated header."]},
                )
            )
        key = parse_key(raw_key)
        if key is None:
            return self.problem(
                InvalidRequest(
                    f"The {self.options.header} header is not a valid key.",
                    {self.options.header: [f"1-{MAX_KEY_CHARS} printable ASCII characters."]},
                )
            )
        return key

    def too_large(self) -> Answer:
        return self.problem(PayloadTooLarge("The request body is over the limit."))

    def truncated(self) -> Answer:
        """The body ended before its Content-Length: a 400, and the key stays unclaimed."""
        return self.problem(InvalidRequest("The body ended before its Content-Length."))

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
                IdempotencyIdentityRequired(
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
        )

    def claim(self, store: IdempotencyStore, attempt: Attempt) -> Answer | None:
        """None: this request holds the key and runs. Else what to answer instead.

        A duplicate of a request still running waits up to ``wait_seconds`` for its
        response (polling the record), then gets 409.
        """
        return drive(self._claiming(store, attempt))

    async def aclaim(self, store: AsyncIdempotencyStore, attempt: Attempt) -> Answer | None:
        return await drive_async(self._claiming(store, attempt))

    def _claiming(
        self, store: IdempotencyStore | AsyncIdempotencyStore, attempt: Attempt
    ) -> Flow[Answer | None]:
        """The claim as a flow (the engine's shape: it yields its store calls and pauses)."""
        deadline = time.monotonic() + self.options.wait_seconds
        pause = _FIRST_PAUSE_SECONDS
        while True:
            attempt.clock.held_from = time.monotonic()
            args = (
                attempt.record,
                attempt.fingerprint,
                attempt.owner,
                self.options.lock_seconds,
                attempt.legacy,
            )
            try:
                outcome = yield functools.partial(store.begin, *args)
            except (TokenError, ValueError, KeyError, TypeError) as exc:
                return self._spanned(attempt, outcome=None, answer=self.store_failed(exc), error=exc)
            left = deadline - time.monotonic()
            if not isinstance(outcome, InProgress) or left <= 0:
                return self._spanned(attempt, outcome, self.decide(outcome))
            yield min(pause, left)
            pause = min(pause * 2, _MAX_PAUSE_SECONDS)

    @staticmethod
    def _spanned(
        attempt: Attempt, outcome: Outcome | None, answer: Answer | None, error: BaseException | None = None
    ) -> Answer | None:
        """The claim's answer; a refused attempt's span ends here (a claimed one's at settle)."""
        if answer is None:
            attempt.span.set_outcome("executed")  # until settle says otherwise
            return None
        if isinstance(outcome, StoredResponse):
            attempt.span.set_outcome("replayed")
        elif isinstance(outcome, InProgress):
            attempt.span.set_outcome("conflict")
        elif isinstance(outcome, Mismatch):
            attempt.span.set_outcome("mismatch")
        else:
            attempt.span.set_outcome("error")
            if error is not None:
                attempt.span.record_error(error)
        attempt.span.end()
        return answer

    def decide(self, outcome: Outcome) -> Answer | None:
        if isinstance(outcome, Claimed):
            return None
        self._count_refusal(outcome)
        if isinstance(outcome, StoredResponse):
            return Answer(outcome.status, outcome.replay_headers(), outcome.body, replayed=True)
        if isinstance(outcome, InProgress):
            return self.problem(
                IdempotencyKeyInUse(
                    f"A request with this {self.options.header} is still being processed; retry later.",
                    outcome.retry_after_seconds,
                )
            )
        assert isinstance(outcome, Mismatch)
        return self.problem(
            IdempotencyKeyMismatch(f"This {self.options.header} was used for a different request.")
        )

    def _count(self, name: str, **labels: str) -> None:
        self.telemetry.count(name, self.options.telemetry_scope, **labels)

    def _count_refusal(self, outcome: Outcome) -> None:
        if isinstance(outcome, StoredResponse):
            self._count("replays")
        elif isinstance(outcome, InProgress):
            self._count("conflicts", code=IdempotencyKeyInUse.code)
        else:
            self._count("mismatches", field="fingerprint")

    def store_failed(self, exc: BaseException) -> Answer:
        """Fail closed: the request does not run unguarded."""
        self._count("store_errors", operation="begin")
        if isinstance(exc, ServiceUnavailable):
            return self.problem(exc)
        # the store refused the record (not an idempotency record, unreadable)
        log.error("the idempotency store refused a request: %s", exc)
        return self.problem(
            ServiceUnavailable("The idempotency store could not handle this key; the request did not run.")
        )

    def problem(self, error: TokenError) -> Answer:
        return _answer(problem_for(error))

    # -- while the app runs ----------------------------------------------------------------

    def hold(self, store: IdempotencyStore, attempt: Attempt) -> AbstractContextManager[Any]:
        """The app runs (and its body streams) inside this: the one place a request holds the key.

        The claim is renewed every third of ``lock_seconds`` until the block exits
        (:mod:`token_service.client._renewal`); call :meth:`settle` inside it, so the
        claim stays held while its outcome is stored (and tried again).
        """

        def renew() -> None:
            sent_at = time.monotonic()
            self._renewed(
                attempt, store.renew(attempt.record, attempt.owner, self.options.lock_seconds), sent_at
            )

        lost = functools.partial(self._claim_lost, attempt)
        return _renewing(LeaseRenewer(renew, interval_for(self.options.lock_seconds), on_lost=lost))

    def ahold(self, store: AsyncIdempotencyStore, attempt: Attempt) -> AbstractAsyncContextManager[Any]:
        async def renew() -> None:
            sent_at = time.monotonic()
            held = await store.renew(attempt.record, attempt.owner, self.options.lock_seconds)
            self._renewed(attempt, held, sent_at)

        lost = functools.partial(self._claim_lost, attempt)
        return _arenewing(AsyncLeaseRenewer(renew, interval_for(self.options.lock_seconds), on_lost=lost))

    @staticmethod
    def _renewed(attempt: Attempt, held: bool, sent_at: float) -> None:
        if not held:
            raise LeaseLost("the Idempotency-Key's claim ran out or was taken over")
        attempt.clock.held_from = max(attempt.clock.held_from, sent_at)

    def _claim_lost(self, attempt: Attempt, exc: TokenError) -> None:
        if attempt.clock.settling:
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
    ) -> OutcomeNotRecorded | None:
        """Store what duplicates get, or free the key (inside :meth:`hold`). Raises no store error:
        a store that cannot answer is tried again while the claim can be held; past that, the
        response that could not be kept is returned as an OutcomeNotRecorded (see the module docs)."""
        return drive(self._settling(store, attempt, recorder))

    async def asettle(
        self, store: AsyncIdempotencyStore, attempt: Attempt, recorder: Recorder | None
    ) -> OutcomeNotRecorded | None:
        return await drive_async(self._settling(store, attempt, recorder))

    def _settling(
        self, store: IdempotencyStore | AsyncIdempotencyStore, attempt: Attempt, recorder: Recorder | None
    ) -> Flow[OutcomeNotRecorded | None]:
        stored = recorder.stored() if recorder is not None else None
        attempt.clock.settling = True
        failures = 0
        while True:
            try:
                if stored is None:
                    yield functools.partial(store.release, attempt.record, attempt.owner)
                    self._released(attempt)
                else:
                    kept = yield functools.partial(store.store, *self._store_args(attempt, stored))
                    self._stored(attempt, kept, unknown=failures > 0)
                return None
            except ServiceUnavailable as exc:
                failures += 1
                pause = self._settle_pause(attempt, failures)
                if pause is None:
                    return self._settle_failed(attempt, stored, exc)
                yield pause
            except TokenError as exc:
                return self._settle_failed(attempt, stored, exc)

    def _store_args(
        self, attempt: Attempt, stored: StoredResponse
    ) -> tuple[str, str, str, StoredResponse, int]:
        return attempt.record, attempt.fingerprint, attempt.owner, stored, self.options.ttl_seconds

    def _settle_pause(self, attempt: Attempt, failures: int) -> float | None:
        lock_seconds = self.options.lock_seconds
        return settle_pause(attempt.clock.held_from + lock_seconds - time.monotonic(), lock_seconds, failures)

    def not_recorded(self, exc: OutcomeNotRecorded) -> Answer:
        """What a client gets instead of a response that could not be kept (Django's middleware;
        the WSGI and ASGI ones break the response off): a 500 ``outcome_not_recorded``."""
        return self.problem(
            OutcomeNotRecorded(
                "The request ran, but its response could not be recorded: the idempotency store did "
                f"not answer. Do not send it again as a new request: with this {self.options.header} "
                "a retry is refused (409) while the request's claim lasts, and may run it again after that.",
                operation=exc.operation,
                scope=exc.scope,
            )
        )

    def _released(self, attempt: Attempt) -> None:
        self._count("executions", outcome="released")
        attempt.span.set_outcome("released")
        attempt.span.end()

    def _stored(self, attempt: Attempt, kept: bool, *, unknown: bool = False) -> None:
        self._count("executions", outcome="succeeded" if kept else "lease_lost")
        attempt.span.set_outcome("executed" if kept else "lease_lost")
        attempt.span.end()
        if not kept and unknown:
            # an earlier try's reply was lost: it may be that try which stored it
            log.warning("an idempotent response was stored by a try whose reply was lost, or not at all")
        elif not kept:
            log.warning(
                "an idempotent request outlived its %d s lock; its response was not stored",
                self.options.lock_seconds,
            )

    def _settle_failed(
        self, attempt: Attempt, stored: StoredResponse | None, exc: TokenError
    ) -> OutcomeNotRecorded | None:
        self._count("executions", outcome="error")
        attempt.span.set_outcome("error")
        attempt.span.record_error(exc)
        attempt.span.end()
        if isinstance(exc, ServiceUnavailable):
            self._count("store_errors", operation="release" if stored is None else "store")
        if stored is None:
            # the claim runs out by itself after lock_seconds
            log.error("could not free an Idempotency-Key: %s", exc)
            return None
        if not isinstance(exc, ServiceUnavailable):
            log.error("could not store an idempotent response: %s", exc)
            return None
        ref = attempt.record.rsplit(":", 1)[-1]
        not_recorded = OutcomeNotRecorded(
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
def _renewing(renewer: LeaseRenewer) -> Iterator[LeaseRenewer]:
    renewer.start()
    try:
        yield renewer
    finally:
        # the outcome is stored (or given up) inside the block: a renewal in flight now lands on a
        # settled record and is refused, so nothing waits for it
        renewer.stop(timeout_seconds=0)


@contextlib.asynccontextmanager
async def _arenewing(renewer: AsyncLeaseRenewer) -> AsyncIterator[AsyncLeaseRenewer]:
    renewer.start()
    try:
        yield renewer
    finally:
        await renewer.stop()
