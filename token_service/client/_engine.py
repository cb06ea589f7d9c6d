"""The guard's engine: every decision of begin -> run / replay / refuse, renewal and settle, once.

No I/O of its own (httpx's ``auth_flow`` shape): each step a guard takes is a generator
(a *flow*) that yields what is to be done — a store call to make (a callable: the async
driver awaits what it returns) or a pause in seconds — and is sent back its reply or
thrown its error. :func:`drive` runs a flow with blocking calls (:class:`Guard`),
:func:`drive_async` awaiting them (:class:`AsyncGuard`); the two do nothing else, so
sync and async guards decide alike by construction. The flows:

- start: begin; a lease is held (renewed from then on) or the stored result replayed;
  a live holder is waited out for ``wait_seconds``, polling; any other refusal is
  counted and reported to its hook, then raised;
- succeed: the result stored as JSON (``complete``), tried again with back-off while
  the store cannot answer and the lease can be held (``_renewal.settle_pause``); a
  result the store refuses (too large) records a terminal failure so the work never
  runs twice; past the lease, :class:`~token_service.errors.OutcomeNotRecorded`;
- abandon: the lease released for a retry or a terminal failure recorded (``fail``),
  with the same retries.

What a guard's store calls address is its client's business (``GuardClient``): an
issued token on either transport, or a keyed operation's record on the direct one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Generator, Mapping
from typing import Any, Generic, NamedTuple, Protocol, TypedDict, TypeVar, Unpack

from token_service.errors import (
    InvalidRequest,
    LeaseLost,
    OutcomeNotRecorded,
    PayloadTooLarge,
    ServiceUnavailable,
    TokenError,
    TokenFailed,
    TokenInProgress,
    TokenMismatch,
    TokenUsed,
)
from token_service.records import Completed, FailRecorded, Finished, Renewed, Started, dump_json
from token_service.tokens import new_request_id, token_digest

from ._renewal import interval_for, settle_pause
from ._telemetry import DEFAULT_TELEMETRY, GuardSpan, Telemetry
from ._typed_results import dump_result, load_result, return_type

# the guard's logger: what operators filter on
log = logging.getLogger("token_service.client.guard")

__all__ = [
    "AsyncGuardClient",
    "BeginOptions",
    "Flow",
    "GuardClient",
    "GuardEngine",
    "GuardFactory",
    "GuardHookArgs",
    "GuardHooks",
    "GuardOptions",
    "Terminal",
    "as_json",
    "describe_error",
    "drive",
    "drive_async",
    "hooks_of",
]

T = TypeVar("T")
ClientT = TypeVar("ClientT", bound="GuardClient | AsyncGuardClient")  # what a guard calls
# Which exceptions are terminal failures: a tuple of classes or a predicate.
Terminal = tuple[type[BaseException], ...] | Callable[[BaseException], bool]
_FIRST_POLL_SECONDS = 0.02
_MAX_POLL_SECONDS = 0.25
# The lease a renewer assumes when neither the guard nor the begin reply says how long it is
# (a service older than the reply's lease_seconds): the shortest the API grants
_SHORTEST_LEASE_SECONDS = 1.0


class BeginOptions(TypedDict):
    """What a guard's every begin sends besides the token and scope (one id for all its retries)."""

    subject: str | None
    fingerprint: str | None
    request_id: str | None
    lease_seconds: int | None


class GuardClient(Protocol):
    """What a :class:`Guard` needs of its client (:class:`~token_service.client.TokenClient`)."""

    def begin(self, token: str, scope: str, **options: Unpack[BeginOptions]) -> Started | Finished: ...
    def renew(self, token: str, lease_id: str, *, lease_seconds: int | None = ...) -> Renewed: ...
    def complete(self, token: str, lease_id: str, result: Any = ...) -> Completed: ...
    def fail(self, token: str, lease_id: str, *, retryable: bool = ..., error: Any = ...) -> FailRecorded: ...


class AsyncGuardClient(Protocol):
    """What an :class:`AsyncGuard` needs of its client (:class:`~token_service.client.AsyncTokenClient`)."""

    async def begin(self, token: str, scope: str, **options: Unpack[BeginOptions]) -> Started | Finished: ...
    async def renew(self, token: str, lease_id: str, *, lease_seconds: int | None = ...) -> Renewed: ...
    async def complete(self, token: str, lease_id: str, result: Any = ...) -> Completed: ...
    async def fail(
        self, token: str, lease_id: str, *, retryable: bool = ..., error: Any = ...
    ) -> FailRecorded: ...


class GuardFactory(Protocol):
    """A client that makes guards (:class:`TokenClient` or :class:`AsyncTokenClient`)."""

    @property
    def begin(self) -> Callable[..., Any]: ...
    @property
    def guard(self) -> Callable[..., Any]: ...


class GuardHooks(NamedTuple):
    """What a guard calls when it answers without running the work, or loses its lease (see the SDK
    docs' Hooks). One value, made once (per decorator) and handed to every guard: immutable, and
    a tuple so that a guard given its hooks by name builds it cheaply."""

    on_replay: Callable[[Any], Any] | None = None
    on_conflict: Callable[[Any, TokenError], Any] | None = None
    on_mismatch: Callable[[Any, TokenMismatch], Any] | None = None
    on_lease_lost: Callable[[Any, TokenError], Any] | None = None


NO_HOOKS = GuardHooks()


class GuardHookArgs(TypedDict, total=False):
    """:class:`GuardHooks` as keyword arguments (``on_replay=...``): what every guard maker takes."""

    on_replay: Callable[[Any], Any] | None
    on_conflict: Callable[[Any, TokenError], Any] | None
    on_mismatch: Callable[[Any, TokenMismatch], Any] | None
    on_lease_lost: Callable[[Any, TokenError], Any] | None


def hooks_of(hooks: GuardHooks | None, hook_args: Mapping[str, Any]) -> GuardHooks:
    """One :class:`GuardHooks` from ``hooks=`` and the hooks given one by one (those not None win),
    for whatever makes guards to build once. A name that is not a hook is a TypeError, as any
    unknown keyword argument is."""
    unknown = sorted(set(hook_args) - set(GuardHooks._fields))
    if unknown:
        raise TypeError(f"unexpected keyword argument {', '.join(map(repr, unknown))}")
    base = NO_HOOKS if hooks is None else hooks
    given = {name: hook for name, hook in hook_args.items() if hook is not None}
    return base._replace(**given) if given else base


class GuardOptions(GuardHookArgs, total=False):
    """The options of a guard (``client.guard(token, scope, **options)``), all optional."""

    subject: str | None
    fingerprint: str | None
    request_id: str | None
    lease_seconds: int | None
    terminal: Terminal
    wait_seconds: float
    renew: bool
    result_type: Any
    hooks: GuardHooks | None


def describe_error(exc: BaseException) -> dict[str, str]:
    """What a terminal failure stores by default: the exception's class name and message."""
    return {"type": type(exc).__name__, "message": str(exc)}


def as_json(value: Any) -> Any:
    """The JSON form of ``value`` (what a duplicate will be handed back)."""
    return json.loads(dump_json(value))


_NO_SPAN = contextlib.nullcontext()


class GuardEngine(Generic[ClientT]):
    # how long start() waits out a live holder: set by the first TokenInProgress of a start
    _wait_until: float | None = None
    _next_poll_seconds = _FIRST_POLL_SECONDS
    # A new guard's state, read here until a guard sets its own (a guard per call: each
    # attribute set in __init__ was a dict insertion on every call).
    lease: Started | None = None
    # The lease as last acknowledged: when (time.monotonic()) the begin or renew that Redis
    # answered was sent, and the length its reply gave (None: the reply did not say). One
    # tuple, so the renewer thread replaces it whole.
    _held: tuple[float, float | None] = (0.0, None)
    # set while the outcome is being stored: a renewal refused then is for the settle to judge
    _settling_now = False
    _held_lease_id = ""
    # a keyed operation's key (keyed.py sets it): what OutcomeNotRecorded reports
    key: Any = None
    replayed = False
    lease_lost: TokenError | None = None
    _result: Any = None
    _span: GuardSpan | None = None
    _current: contextlib.AbstractContextManager[Any] | None = None

    def __init__(
        self,
        client: ClientT,
        token: str,
        scope: str,
        *,
        subject: str | None = None,
        fingerprint: str | None = None,
        request_id: str | None = None,
        lease_seconds: int | None = None,
        terminal: Terminal = (),
        wait_seconds: float = 0.0,
        renew: bool = True,
        result_type: Any = None,
        hooks: GuardHooks | None = None,
        on_replay: Callable[[Any], Any] | None = None,
        on_conflict: Callable[[Any, TokenError], Any] | None = None,
        on_mismatch: Callable[[Any, TokenMismatch], Any] | None = None,
        on_lease_lost: Callable[[Any, TokenError], Any] | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.client = client
        if telemetry is None:  # what the client counts with, as every guard it makes
            telemetry = getattr(client, "telemetry", DEFAULT_TELEMETRY)
        self.token = token
        self.scope = scope
        self.subject = subject
        self.fingerprint = fingerprint
        # one id for every begin of this guard: a retried begin gets its own lease back
        self.request_id = request_id or new_request_id()
        self.lease_seconds = lease_seconds
        self.terminal = terminal
        self.wait_seconds = wait_seconds
        self.renew = renew
        self.result_type = result_type
        if on_replay is None and on_conflict is None and on_mismatch is None and on_lease_lost is None:
            self.hooks = NO_HOOKS if hooks is None else hooks  # one value (or none): nothing to build
        else:  # hooks given by name, on top of hooks=
            base = NO_HOOKS if hooks is None else hooks
            self.hooks = GuardHooks(
                base.on_replay if on_replay is None else on_replay,
                base.on_conflict if on_conflict is None else on_conflict,
                base.on_mismatch if on_mismatch is None else on_mismatch,
                base.on_lease_lost if on_lease_lost is None else on_lease_lost,
            )
        self.telemetry = telemetry

    def __repr__(self) -> str:
        # never the token: it is a secret
        return f"<{type(self).__name__} scope={self.scope!r} holds_lease={self.lease is not None}>"

    @property
    def result(self) -> Any:
        """The operation's result: set it inside ``with``; the stored one on a replay."""
        return self._result

    @result.setter
    def result(self, value: Any) -> None:
        if self.replayed:
            raise AttributeError("this guard replayed a stored result; its result is read-only")
        self._result = value

    def _took(self, outcome: Started | Finished, sent_at: float) -> bool:
        """A begin answered: True when it took the lease (renewed from now on, unless ``renew=False``)."""
        if isinstance(outcome, Finished):
            self.replayed = True
            self._result = self._typed(outcome.result)
            self._settled("replayed")
            self.telemetry.count("replays", self.scope)
            if self.hooks.on_replay is not None:
                self.hooks.on_replay(self)
            return False
        self.lease = outcome
        self._held = (sent_at, outcome.lease_seconds)
        self._held_lease_id = outcome.lease_id  # renewed until settled, also while fail is retried
        if self.renew:
            self._start_renewer()
        return True

    def _start_renewer(self) -> None:
        raise NotImplementedError

    def _pause_after(self, exc: TokenError, sent_at: float) -> float | None:
        """How long to wait before begin is sent again, after ``exc`` refused the one sent at ``sent_at``.

        Only while another holder is live and ``wait_seconds`` (counted from the first begin) are not
        spent; otherwise None: the refusal stands (counted, the span ended, the hook run: a hook may
        raise its own error) and the caller raises ``exc``.
        """
        if isinstance(exc, TokenInProgress):
            if self._wait_until is None:
                self._wait_until = sent_at + self.wait_seconds
                self._next_poll_seconds = _FIRST_POLL_SECONDS
            remaining = self._wait_until - time.monotonic()
            if remaining > 0:
                pause = min(self._next_poll_seconds, exc.retry_after_seconds, remaining)
                self._next_poll_seconds = min(self._next_poll_seconds * 2, _MAX_POLL_SECONDS)
                return pause
        self._refused(exc)
        return None

    def _refused(self, exc: TokenError) -> None:
        """A begin refused: count it, end the span, run the hook (which may raise its own error)."""
        if isinstance(exc, TokenMismatch):
            self._settled("mismatch")
            self.telemetry.count("mismatches", self.scope, field=exc.field or "")
            if self.hooks.on_mismatch is not None:
                self.hooks.on_mismatch(self, exc)
        elif isinstance(exc, TokenInProgress | TokenUsed | TokenFailed):
            self._settled("conflict")
            self.telemetry.count("conflicts", self.scope, code=exc.code)
            if self.hooks.on_conflict is not None:
                self.hooks.on_conflict(self, exc)
        else:
            self._store_error("begin", exc)
            self._settled("error", exc)

    def _store_error(self, operation: str, exc: BaseException) -> None:
        if isinstance(exc, ServiceUnavailable):
            self.telemetry.count("store_errors", self.scope, operation=operation)

    def _open_span(self, *, is_async: bool) -> None:
        if self._span is None:
            self._span = self.telemetry.start_span(self.scope, is_async=is_async)

    def _enter_span(self) -> None:
        """The span current inside ``with guard:`` (the block's own spans nest under it)."""
        if self._span is not None:
            self._current = self._span.current()
            self._current.__enter__()

    def _exit_span(self) -> None:
        current, self._current = self._current, None
        if current is not None:
            current.__exit__(None, None, None)

    def _settled(self, outcome: str, exc: BaseException | None = None) -> None:
        span, self._span = self._span, None
        if span is not None:
            span.set_outcome(outcome)
            if exc is not None:
                span.record_error(exc)
            span.end()

    def _lost(self, exc: TokenError) -> None:
        """The renewer found the lease gone. While the outcome is being stored it is that store's
        reply that tells (a renewal sent as complete landed is refused, and means nothing)."""
        if not self._settling_now:
            self._report_lost(exc)

    def _report_lost(self, exc: TokenError) -> None:
        """The lease is gone while the work runs (reported once, found by the renewer or by complete)."""
        if self.lease_lost is not None:
            return
        self.lease_lost = exc
        log.error("a %s operation lost its lease while it ran: %s", self.scope, exc)
        self.telemetry.count("lease_losses", self.scope)
        if self._span is not None:
            self._span.add_event("lease_lost")
        if self.hooks.on_lease_lost is not None:
            self.hooks.on_lease_lost(self, exc)

    def _renew_failed(self, exc: TokenError) -> None:
        """A renewal the store could not answer (renewing goes on)."""
        self.telemetry.count("store_errors", self.scope, operation="renew")

    def _renew_every(self) -> float:
        return interval_for(self._lease_left_seconds())

    def _renewed(self, reply: Renewed, sent_at: float) -> Renewed:
        """A renewal Redis acknowledged: the lease now runs from when it was sent."""
        if sent_at > self._held[0]:
            self._held = (sent_at, reply.lease_seconds)
        return reply

    def _settle_pause(self, failures: int) -> float | None:
        """After ``failures`` attempts to store the outcome that the store could not answer: how long
        to wait before the next, or None when the lease can no longer be held (give up)."""
        return settle_pause(self._lease_left_seconds(), self._granted_seconds(), failures)

    def _not_recorded(
        self,
        operation: str,
        lease_id: str,
        down: ServiceUnavailable,
        *,
        result: Any = None,
        error: Any = None,
    ) -> OutcomeNotRecorded:
        """The error for an outcome the store never took (raised ``from down``), logged once here."""
        self._store_error(operation, down)
        token_ref = token_digest(self.token)
        key = "" if self.key is None else f", key {self.key!r}"
        not_recorded = OutcomeNotRecorded(
            f"A {self.scope} operation ran, but its outcome ({operation}) could not be recorded: "
            f"the store did not answer while its lease could be held (token_ref {token_ref}{key}, "
            f"lease {lease_id}; last error: {down}). To the token this is a crashed holder: once the "
            "lease runs out a duplicate may run it again. Reconcile it: token-service admin show "
            f"{token_ref}.",
            operation=operation,
            scope=self.scope,
            token_ref=token_ref,
            key=self.key,
            lease_id=lease_id,
            result=result,
            error=error,
        )
        log.error("%s", not_recorded)
        return not_recorded

    def _granted_seconds(self) -> float:
        granted = self._held[1]
        if granted is None:  # a service too old to say: what we asked for, else the shortest lease
            return float(self.lease_seconds) if self.lease_seconds is not None else _SHORTEST_LEASE_SECONDS
        return granted

    def _lease_left_seconds(self) -> float:
        """What is left of the lease, on the monotonic clock: the length the last acknowledged
        begin or renew gave, counted from when it was sent (Redis started it later, so this errs early).

        Never ``lease_expires_ms`` against ``time.time()``: that compares Redis's clock with this
        host's, and a host whose clock is off (a VM after suspend, no NTP) would renew too late
        and let a duplicate run the operation a second time.
        """
        return self._granted_seconds() - (time.monotonic() - self._held[0])

    def _typed(self, stored: Any) -> Any:
        """The stored JSON read back as ``result_type`` (the JSON form when it does not read)."""
        try:
            return load_result(stored, self.result_type)
        except (TypeError, ValueError, KeyError) as exc:
            log.warning("a stored %s result does not read as %r: %s", self.scope, self.result_type, exc)
            return stored

    def is_terminal(self, exc: BaseException) -> bool:
        if isinstance(self.terminal, tuple):
            return isinstance(exc, self.terminal)
        return bool(self.terminal(exc))

    @property
    def lease_id(self) -> str:
        if self.lease is None:
            raise RuntimeError("this guard holds no lease")
        return self.lease.lease_id

    def _serialized(self, result: Any) -> Any:
        try:
            return as_json(dump_result(result))
        except RecursionError:  # a value that contains itself, or nested past Python's stack
            raise TypeError("a guarded result must be storable as JSON: it nests too deeply") from None
        except (TypeError, ValueError) as exc:
            raise TypeError(f"a guarded result must be storable as JSON: {exc}") from exc

    def _typed_for(self, operation: Callable[..., Any]) -> None:
        if self.result_type is None:
            self.result_type = return_type(operation)

    def _completed(self, stored: Any) -> Any:
        """complete stored ``stored``: the lease is done; the result as duplicates will get it."""
        self.lease = None
        self._result = self._typed(stored)
        self._executed("succeeded")
        return self._result

    def _complete_refused(self, exc: TokenError) -> None:
        """complete refused by the store: nothing was stored."""
        if isinstance(exc, LeaseLost):
            self.lease = None
            self._report_lost(exc)
            self._executed("lease_lost", exc)
        else:
            self._store_error("complete", exc)
            self._executed("error", exc)

    def _ending(self, exc: BaseException | None, retryable: bool | None, error: Any) -> tuple[str, bool, Any]:
        """What ``abandon`` sends to fail (lease id, retryable, error); the lease counts as ended."""
        if retryable is None:
            retryable = exc is None or not self.is_terminal(exc)
        if error is None and exc is not None and not retryable:
            error = describe_error(exc)
        lease_id = self.lease_id
        self.lease = None
        self._executed("released" if retryable else "failed", exc)
        return lease_id, retryable, error

    def _fail_refused(self, exc: TokenError) -> None:
        """fail refused by the store: a lost lease is reported, anything else counted."""
        if isinstance(exc, LeaseLost):
            self._report_lost(exc)
        else:
            self._store_error("fail", exc)

    def _executed(self, outcome: str, exc: BaseException | None = None) -> None:
        self.telemetry.count("executions", self.scope, outcome=outcome)
        self._settled("executed" if outcome == "succeeded" else outcome, exc)

    # -- the flows: each yields its store calls (callables) and pauses (seconds) to a driver ----

    _is_async = False  # the spans say which kind of guard they belong to

    def _begin(self) -> Any:
        return self.client.begin(
            self.token,
            self.scope,
            subject=self.subject,
            fingerprint=self.fingerprint,
            request_id=self.request_id,
            lease_seconds=self.lease_seconds,
        )

    def _stop_renewer(self) -> Any:
        raise NotImplementedError

    def _starting(self) -> Flow[bool]:
        """Begin. True: this caller holds the lease and must run the operation. False: it already
        succeeded; ``result`` holds the stored result. Refusals are raised (after waiting out a
        live holder for ``wait_seconds``)."""
        self._open_span(is_async=self._is_async)
        self._wait_until = None
        while True:
            sent_at = time.monotonic()
            try:
                outcome = yield self._begin
            except TokenError as exc:
                pause = self._pause_after(exc, sent_at)
                if pause is None:
                    raise
                yield pause
                continue
            return self._took(outcome, sent_at)

    def _settling(self, store: Callable[[], Any]) -> Flow[Any]:
        """``store()`` (complete or fail), tried again while the store cannot answer and the lease
        can be held (renewed in the background meanwhile); then its last ServiceUnavailable."""
        self._settling_now = True
        failures = 0
        while True:
            try:
                return (yield store)
            except ServiceUnavailable:
                failures += 1
                pause = self._settle_pause(failures)
                if pause is None:
                    raise
                yield pause

    def _succeeding(self, result: Any) -> Flow[Any]:
        try:
            stored = self._serialized(result)
        except TypeError as exc:
            # the operation ran but its result cannot be stored: never let a duplicate run it again
            yield from self._abandoning(exc, False, None)
            raise
        lease_id = self.lease_id
        token = self.token
        try:
            yield from self._settling(lambda: self.client.complete(token, lease_id, stored))
        except (InvalidRequest, PayloadTooLarge) as exc:
            # The store refused the result (e.g. too large once JSON-encoded). The operation ran:
            # record a terminal failure so the token is never reopened and it never runs twice.
            yield from self._abandoning_quietly(exc, False)
            raise
        except ServiceUnavailable as down:
            yield self._stop_renewer
            self.lease = None
            self._executed("error", down)
            raise self._not_recorded("complete", lease_id, down, result=stored) from down
        except TokenError as exc:
            yield self._stop_renewer
            self._complete_refused(exc)
            raise
        yield self._stop_renewer
        return self._completed(stored)

    def _abandoning(self, exc: BaseException | None, retryable: bool | None, error: Any) -> Flow[None]:
        lease_id, retryable, error = self._ending(exc, retryable, error)
        token = self.token

        def fail() -> Any:
            return self.client.fail(token, lease_id, retryable=retryable, error=error)

        try:
            yield from self._settling(fail)
        except ServiceUnavailable as down:
            yield self._stop_renewer
            operation = "release" if retryable else "fail"
            raise self._not_recorded(operation, lease_id, down, error=error) from down
        except TokenError as refused:
            yield self._stop_renewer
            self._fail_refused(refused)
            raise
        yield self._stop_renewer

    def _abandoning_quietly(self, exc: BaseException | None, retryable: bool | None) -> Flow[None]:
        try:
            yield from self._abandoning(exc, retryable, None)
        except OutcomeNotRecorded as not_recorded:
            if not_recorded.operation != "release":
                raise
        except TokenError as fail_error:
            # the caller's exception matters more; the lease runs out on its own
            log.warning("could not end the lease after a failure: %s", fail_error)


# A guard's step: it yields a store call (or a pause, in seconds) and is sent its reply.
Flow = Generator[Callable[[], Any] | float, Any, T]


def drive(flow: Flow[T]) -> T:
    """Run ``flow`` with blocking calls: each callable it yields is called, each pause slept."""
    try:
        step = next(flow)
        while True:
            try:
                reply = step() if callable(step) else time.sleep(step)  # type: ignore[func-returns-value]
            except BaseException as exc:  # raised where the flow made the call, for it to handle
                step = flow.throw(exc)
            else:
                step = flow.send(reply)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def drive_async(flow: Flow[T]) -> T:
    """:func:`drive` for asyncio: what each callable returns is awaited, pauses are ``asyncio.sleep``."""
    try:
        step = next(flow)
        while True:
            try:
                reply = await step() if callable(step) else await asyncio.sleep(step)  # type: ignore[func-returns-value]
            except BaseException as exc:
                step = flow.throw(exc)
            else:
                step = flow.send(reply)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
