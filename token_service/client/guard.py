"""The two-phase guard: run an operation at most once per token, replay its result to duplicates.

::

    try:
        with client.guard(token, "payment.create") as guard:
            guard.result = charge(card, amount)
        receipt = guard.result
    except Replayed as replay:      # a duplicate: the block did not run
        receipt = replay.result     # the same as the first call's

or ``guard.run(charge, card, amount)``, or the :func:`guarded` decorator.

The ``with`` form cannot run its block on a replay: ``__enter__`` raises
:class:`Replayed` (carrying the stored result) instead of entering it, and a
replayed guard's ``result`` is read-only.

``begin`` either takes a lease or — when the operation already SUCCEEDED —
returns the stored result in the same round trip, and the body does not run.
When the body returns, its result is stored with ``complete``. When it
raises, the token is released for a retry (the default) or, for the
exceptions declared ``terminal``, a terminal failure is recorded: duplicates
then get :class:`~token_service.errors.TokenFailed` carrying the stored error.

While the body runs, its lease is renewed in the background (every third of
the lease; :mod:`token_service.client._renewal`), so work slower than its lease
still runs once. The lease's length comes from begin's reply and is counted on
the monotonic clock from when begin was sent: no decision reads this host's
wall clock, so a client whose clock is off renews on time all the same. A
lease lost anyway (the process stalled past it, the token was revoked) is
reported through ``on_lease_lost``, the log and the ``lease_losses`` counter,
and ``complete`` is refused: the guard raises
:class:`~token_service.errors.LeaseLost` and the result of whoever took over
stands.

Storing the outcome (``complete``, or ``fail`` after an exception) is tried again,
with back-off, while the store cannot answer and the lease can still be held: its
length from the last begin or renewal Redis acknowledged, on the monotonic clock,
less a margin; the lease is renewed meanwhile. A store back within that changes
nothing the caller sees. Past it, the work has run and its outcome is not recorded:
:class:`~token_service.errors.OutcomeNotRecorded` (never ``ServiceUnavailable``,
which means the work did not run), carrying what a person needs to reconcile. To
the token that is a crashed holder: after the lease a duplicate may run it again
(docs/sdk.md, "When the store goes away as the outcome is stored").

Results are stored as JSON (:mod:`token_service.client._typed_results`); with a
``result_type`` (or the return annotation of the function the guard runs)
they are read back as that type — dataclasses, pydantic models, tuples — so
the first caller and every duplicate get the same typed value. Hooks
``on_replay(guard)``, ``on_conflict(guard, error)`` and ``on_mismatch(guard,
error)`` run when a call is answered without running the body; the four hooks
are one value, :class:`GuardHooks` (``hooks=``), which whatever makes guards
(``@idempotent``, ``@require_token``) builds once and hands on unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
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

from ._renewal import SCHEDULER, AsyncRenewal, Renewal, interval_for, renew_on_loop, settle_pause
from ._telemetry import DEFAULT_TELEMETRY, GuardSpan, Telemetry
from ._typed_results import dump_result, load_result, return_type

log = logging.getLogger(__name__)

__all__ = ["AsyncGuard", "Guard", "GuardHooks", "Replayed", "describe_error"]

T = TypeVar("T")
ClientT = TypeVar("ClientT")  # what a guard calls: GuardClient, or AsyncGuardClient
# Which exceptions are terminal failures: a tuple of classes or a predicate.
Terminal = tuple[type[BaseException], ...] | Callable[[BaseException], bool]
_FIRST_POLL_SECONDS = 0.02
_MAX_POLL_SECONDS = 0.25
# The lease a renewer assumes when neither the guard nor the begin reply says how long it is
# (a service older than the reply's lease_seconds): the shortest the API grants
_SHORTEST_LEASE_SECONDS = 1.0


class _BeginOptions(TypedDict):
    """What a guard's every begin sends besides the token and scope (one id for all its retries)."""

    subject: str | None
    fingerprint: str | None
    request_id: str | None
    lease_seconds: int | None


class GuardClient(Protocol):
    """What a :class:`Guard` needs of its client (:class:`~token_service.client.TokenClient`)."""

    def begin(self, token: str, scope: str, **options: Unpack[_BeginOptions]) -> Started | Finished: ...
    def renew(self, token: str, lease_id: str, *, lease_seconds: int | None = ...) -> Renewed: ...
    def complete(self, token: str, lease_id: str, result: Any = ...) -> Completed: ...
    def fail(self, token: str, lease_id: str, *, retryable: bool = ..., error: Any = ...) -> FailRecorded: ...


class AsyncGuardClient(Protocol):
    """What an :class:`AsyncGuard` needs of its client (:class:`~token_service.client.AsyncTokenClient`)."""

    async def begin(self, token: str, scope: str, **options: Unpack[_BeginOptions]) -> Started | Finished: ...
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


class Replayed(Exception):
    """``with guard:`` on a token whose operation already succeeded: the block was not run.

    ``result`` is the stored result (what the first caller got). Deliberately
    not a :class:`~token_service.errors.TokenError`, so ``except TokenError``
    does not swallow it by accident.
    """

    def __init__(self, result: Any) -> None:
        super().__init__(
            "the operation already succeeded: its stored result is replayed, the block did not run"
        )
        self.result = result


def describe_error(exc: BaseException) -> dict[str, str]:
    """What a terminal failure stores by default: the exception's class name and message."""
    return {"type": type(exc).__name__, "message": str(exc)}


def as_json(value: Any) -> Any:
    """The JSON form of ``value`` (what a duplicate will be handed back)."""
    return json.loads(dump_json(value))


_NO_SPAN = contextlib.nullcontext()


class _GuardState(Generic[ClientT]):
    # how long start() waits out a live holder: set by the first TokenInProgress of a start
    _wait_until: float | None = None
    _next_poll_seconds = _FIRST_POLL_SECONDS

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
        self.lease: Started | None = None
        # The lease as last acknowledged: when (time.monotonic()) the begin or renew that Redis
        # answered was sent, and the length its reply gave (None: the reply did not say). One
        # tuple, so the renewer thread replaces it whole.
        self._held: tuple[float, float | None] = (0.0, None)
        # set while the outcome is being stored: a renewal refused then is for the settle to judge
        self._settling = False
        self._held_lease_id = ""
        # a keyed operation's key (keyed.py sets it): what OutcomeNotRecorded reports
        self.key: Any = None
        self.replayed = False
        self.lease_lost: TokenError | None = None
        self._result: Any = None
        self._span: GuardSpan | None = None
        self._current: contextlib.AbstractContextManager[Any] | None = None

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

    def _begin_options(self) -> _BeginOptions:
        return {
            "subject": self.subject,
            "fingerprint": self.fingerprint,
            "request_id": self.request_id,
            "lease_seconds": self.lease_seconds,
        }

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
        if not self._settling:
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


class Guard(_GuardState[GuardClient]):
    """One token's two-phase operation, on a :class:`TokenClient`. Use once."""

    _renewal: Renewal | None = None

    def __init__(self, client: GuardClient, token: str, scope: str, **options: Any) -> None:
        super().__init__(client, token, scope, **options)

    def start(self) -> bool:
        """Begin. True: this caller holds the lease and must run the operation.
        False: it already succeeded; ``result`` holds the stored result.

        Raises TokenInProgress when another holder is live (after waiting up to
        ``wait_seconds`` for it to finish), TokenUsed, TokenFailed, TokenInvalid, ...
        While the lease is held it is renewed in the background (unless ``renew=False``)
        until :meth:`succeed` or :meth:`abandon`.
        """
        self._open_span(is_async=False)
        self._wait_until = None
        while True:
            sent_at = time.monotonic()
            try:
                outcome = self.client.begin(self.token, self.scope, **self._begin_options())
            except TokenError as exc:
                pause = self._pause_after(exc, sent_at)
                if pause is None:
                    raise
                time.sleep(pause)
                continue
            return self._took(outcome, sent_at)

    def _start_renewer(self) -> None:
        # held weakly by the scheduler: a guard dropped unsettled is collected and stops renewing
        self._renewal = SCHEDULER.schedule(self, self._renew_every())

    def _stop_renewer(self) -> None:
        renewal, self._renewal = self._renewal, None
        if renewal is not None:
            # Not waiting for a renewal in flight: the outcome is settled (or given up), and a
            # renewal that lands now is refused by Redis or extends a lease nobody uses.
            renewal.stop(timeout_seconds=0)

    def _renew_lease(self) -> Renewed:
        sent_at = time.monotonic()
        return self._renewed(
            self.client.renew(self.token, self._held_lease_id, lease_seconds=self.lease_seconds), sent_at
        )

    def _settle(self, store: Callable[[], T]) -> T:
        """``store()`` (complete or fail), tried again while the store cannot answer and the lease
        can be held (renewed in the background meanwhile); then its last ServiceUnavailable."""
        self._settling = True
        failures = 0
        while True:
            try:
                return store()
            except ServiceUnavailable:
                failures += 1
                pause = self._settle_pause(failures)
                if pause is None:
                    raise
                time.sleep(pause)

    def succeed(self, result: Any) -> Any:
        """Store ``result`` as the operation's outcome; returns it as duplicates will get it.

        While the store cannot answer, storing is tried again for as long as the lease can be
        held (it is renewed meanwhile); past that, :class:`~token_service.errors.OutcomeNotRecorded`.
        Raises :class:`~token_service.errors.LeaseLost` when the lease was lost
        while the operation ran: nothing is stored (whoever took over keeps theirs).
        """
        try:
            stored = self._serialized(result)
        except TypeError as exc:
            # the operation ran but its result cannot be stored: never let a duplicate run it again
            self.abandon(exc, retryable=False)
            raise
        lease_id = self.lease_id
        try:
            self._settle(lambda: self.client.complete(self.token, lease_id, stored))
        except (InvalidRequest, PayloadTooLarge) as exc:
            # The store refused the result (e.g. too large once JSON-encoded). The operation ran:
            # record a terminal failure so the token is never reopened and it never runs twice.
            self.abandon_quietly(exc, retryable=False)
            raise
        except ServiceUnavailable as down:
            self._stop_renewer()
            self.lease = None
            self._executed("error", down)
            raise self._not_recorded("complete", lease_id, down, result=stored) from down
        except TokenError as exc:
            self._stop_renewer()
            self._complete_refused(exc)
            raise
        self._stop_renewer()
        return self._completed(stored)

    def abandon(
        self, exc: BaseException | None = None, *, retryable: bool | None = None, error: Any = None
    ) -> None:
        """End the lease after a failure: release for a retry, or record a terminal failure.

        Tried again while the store cannot answer, as :meth:`succeed` does; past the lease,
        :class:`~token_service.errors.OutcomeNotRecorded` (``operation`` ``release`` or ``fail``).
        """
        lease_id, retryable, error = self._ending(exc, retryable, error)
        try:
            self._settle(lambda: self.client.fail(self.token, lease_id, retryable=retryable, error=error))
        except ServiceUnavailable as down:
            self._stop_renewer()
            operation = "release" if retryable else "fail"
            raise self._not_recorded(operation, lease_id, down, error=error) from down
        except TokenError as refused:
            self._stop_renewer()
            self._fail_refused(refused)
            raise
        self._stop_renewer()

    def abandon_quietly(self, exc: BaseException | None, *, retryable: bool | None = None) -> None:
        """:meth:`abandon`, logging (not raising) a release the store could not take: the lease
        runs out on its own, which releases the token all the same, later. A terminal failure that
        could not be recorded is raised (:class:`~token_service.errors.OutcomeNotRecorded`): a
        duplicate could run the work again after the lease."""
        try:
            self.abandon(exc, retryable=retryable)
        except OutcomeNotRecorded as not_recorded:
            if not_recorded.operation != "release":
                raise
        except TokenError as fail_error:
            # the caller's exception matters more; the lease runs out on its own
            log.warning("could not end the lease after a failure: %s", fail_error)

    def run(self, operation: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``operation`` under the guard; return its result, or the stored one.

        Without a ``result_type``, the operation's return annotation says how
        the stored result is read back.
        """
        self._typed_for(operation)
        if not self.start():
            return self.result
        span = self._span
        try:
            with span.current() if span is not None else _NO_SPAN:
                value = operation(*args, **kwargs)
        except BaseException as exc:
            self.abandon_quietly(exc)
            raise
        return self.succeed(value)

    def __enter__(self) -> Guard:
        """Begin; on a replay raise :class:`Replayed` so the block cannot run."""
        if not self.start():
            raise Replayed(self.result)
        self._enter_span()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self._exit_span()
        if self.lease is None:
            return  # a replay, or already settled inside the block
        if exc is None:
            self.succeed(self.result)
        else:
            self.abandon_quietly(exc)


class AsyncGuard(_GuardState[AsyncGuardClient]):
    """:class:`Guard` for :class:`AsyncTokenClient`; ``async with`` and ``await guard.run(...)``."""

    _renewal: AsyncRenewal | None = None

    def __init__(self, client: AsyncGuardClient, token: str, scope: str, **options: Any) -> None:
        super().__init__(client, token, scope, **options)

    async def start(self) -> bool:
        self._open_span(is_async=True)
        self._wait_until = None
        while True:
            sent_at = time.monotonic()
            try:
                outcome = await self.client.begin(self.token, self.scope, **self._begin_options())
            except TokenError as exc:
                pause = self._pause_after(exc, sent_at)
                if pause is None:
                    raise
                await asyncio.sleep(pause)
                continue
            return self._took(outcome, sent_at)

    def _start_renewer(self) -> None:
        # a timer on this loop, holding the guard weakly: dropped unsettled, it stops renewing
        self._renewal = renew_on_loop(self, self._renew_every())

    async def _stop_renewer(self) -> None:
        renewal, self._renewal = self._renewal, None
        if renewal is not None:
            await renewal.stop()

    async def _renew_lease(self) -> Renewed:
        sent_at = time.monotonic()
        renewed = await self.client.renew(self.token, self._held_lease_id, lease_seconds=self.lease_seconds)
        return self._renewed(renewed, sent_at)

    async def _settle(self, store: Callable[[], Awaitable[T]]) -> T:
        """:meth:`Guard._settle`, awaited."""
        self._settling = True
        failures = 0
        while True:
            try:
                return await store()
            except ServiceUnavailable:
                failures += 1
                pause = self._settle_pause(failures)
                if pause is None:
                    raise
                await asyncio.sleep(pause)

    async def succeed(self, result: Any) -> Any:
        try:
            stored = self._serialized(result)
        except TypeError as exc:
            await self.abandon(exc, retryable=False)
            raise
        lease_id = self.lease_id
        try:
            await self._settle(lambda: self.client.complete(self.token, lease_id, stored))
        except (InvalidRequest, PayloadTooLarge) as exc:
            # as in Guard.succeed: the operation ran, so it must never run again
            await self.abandon_quietly(exc, retryable=False)
            raise
        except ServiceUnavailable as down:
            await self._stop_renewer()
            self.lease = None
            self._executed("error", down)
            raise self._not_recorded("complete", lease_id, down, result=stored) from down
        except TokenError as exc:
            await self._stop_renewer()
            self._complete_refused(exc)
            raise
        await self._stop_renewer()
        return self._completed(stored)

    async def abandon(
        self, exc: BaseException | None = None, *, retryable: bool | None = None, error: Any = None
    ) -> None:
        lease_id, retryable, error = self._ending(exc, retryable, error)
        try:
            await self._settle(
                lambda: self.client.fail(self.token, lease_id, retryable=retryable, error=error)
            )
        except ServiceUnavailable as down:
            await self._stop_renewer()
            operation = "release" if retryable else "fail"
            raise self._not_recorded(operation, lease_id, down, error=error) from down
        except TokenError as refused:
            await self._stop_renewer()
            self._fail_refused(refused)
            raise
        await self._stop_renewer()

    async def abandon_quietly(self, exc: BaseException | None, *, retryable: bool | None = None) -> None:
        try:
            await self.abandon(exc, retryable=retryable)
        except OutcomeNotRecorded as not_recorded:
            if not_recorded.operation != "release":
                raise
        except TokenError as fail_error:
            log.warning("could not end the lease after a failure: %s", fail_error)

    async def run(self, operation: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Await ``operation(*args, **kwargs)`` (a coroutine function) under the guard."""
        self._typed_for(operation)
        if not await self.start():
            return self.result
        span = self._span
        try:
            with span.current() if span is not None else _NO_SPAN:
                value = await operation(*args, **kwargs)
        except BaseException as exc:
            await self.abandon_quietly(exc)
            raise
        return await self.succeed(value)

    async def __aenter__(self) -> AsyncGuard:
        """Begin; on a replay raise :class:`Replayed` so the block cannot run."""
        if not await self.start():
            raise Replayed(self.result)
        self._enter_span()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        self._exit_span()
        if self.lease is None:
            return
        if exc is None:
            await self.succeed(self.result)
        else:
            await self.abandon_quietly(exc)


def guarded(
    client: GuardFactory,
    scope: str,
    *,
    token_arg: str = "token",  # noqa: S107 - a parameter name, not a secret
    subject: str | Callable[..., str | None] | None = None,
    fingerprint: str | Callable[..., str | None] | None = None,
    **guard_options: Any,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a function so each token runs it at most once.

    The token is the decorated function's argument named ``token`` (any
    name: pass ``token_arg="idempotency_token"``). ``subject`` and ``fingerprint``
    are values or callables given the same arguments as the function. Other
    options (``terminal``, ``lease_seconds``, ``wait_seconds``) go to the guard;
    ``request_id`` is refused (every call generates its own).
    A coroutine function needs an :class:`AsyncTokenClient`.
    """
    if "request_id" in guard_options:
        # one id for every call would make different calls "the same request": both would hold the lease
        raise TypeError(
            "guarded() does not take request_id: each call gets its own request id "
            "(use client.guard(..., request_id=...) to retry one specific call)"
        )

    # the hooks, once: each call's guard gets the one value, not four arguments to fold again
    hook_args = {name: guard_options.pop(name) for name in GuardHooks._fields if name in guard_options}
    if hook_args or "hooks" in guard_options:
        guard_options["hooks"] = hooks_of(guard_options.get("hooks"), hook_args)

    def pick(value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return value(*args, **kwargs) if callable(value) else value

    def decorate(operation: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(operation)
        if token_arg not in signature.parameters:
            raise TypeError(f"{operation.__qualname__} has no parameter {token_arg!r} to read the token from")
        is_async = inspect.iscoroutinefunction(operation)
        if is_async != inspect.iscoroutinefunction(client.begin):
            raise TypeError("coroutine functions need an AsyncTokenClient, plain functions a TokenClient")
        typed = {"result_type": guard_options.get("result_type") or return_type(operation)}

        def options(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return {
                "token": bound.arguments[token_arg],
                "scope": scope,
                "subject": pick(subject, args, kwargs),
                "fingerprint": pick(fingerprint, args, kwargs),
                **guard_options,
                **typed,
            }

        if is_async:

            @functools.wraps(operation)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                guard: AsyncGuard = client.guard(**options(args, kwargs))
                return await guard.run(operation, *args, **kwargs)

            return run_async

        @functools.wraps(operation)
        def run(*args: Any, **kwargs: Any) -> Any:
            guard: Guard = client.guard(**options(args, kwargs))
            return guard.run(operation, *args, **kwargs)

        return run

    return decorate
