"""Keep a lease alive while the guarded work runs: renewed every third of its length until it settles.

A lease (a guard's, an Idempotency-Key's lock) is short so that a holder that dies frees the
token on its own; work that outlasts it would lose it half-way, and a duplicate would run it again.

- **one scheduler per process** times the renewals of sync code: a heap of deadlines and one
  daemon thread, made with the first lease and shared by every client and guard. A call whose
  work ends before its first renewal is due costs a heap push and a stop flag: no thread, lock
  or finalizer of its own. The heap's thread never calls the store: each renewal that falls due
  runs on a short-lived thread of its own, so a store call that hangs (up to the client's timeout
  and retries) never delays another lease's renewal; threads exist only while renewals are in
  flight (a long-running lease starts one every third of its length);
- asyncio code is scheduled on its **event loop's own timer heap** (``loop.call_at``, cancelled
  on stop: a scheduler per loop, which dies with the loop); a renewal that falls due runs as a
  task of that loop;
- a guard's renewals (and the Idempotency-Key middlewares' :class:`LeaseRenewer`'s) go on while
  its outcome is stored (``complete`` / ``fail``, tried again for as long as the lease can be
  held: :func:`settle_pause`), and stop once it is; a renewal that lands after the outcome is
  refused by Redis and means nothing (the settle's own reply tells); stopping does not wait for
  a renewal in flight;
- the scheduler holds its guards weakly: a guard dropped without being settled is collected, and
  its next renewal finds it gone and ends;
- a process that dies takes its scheduler with it: the lease runs out exactly as it would without
  renewal. A forked child starts with an empty schedule: it never renews its parent's leases;
- a renewal refused because the lease is no longer the live one (it ran out while the process was
  stalled, or the token was revoked) is final: renewing stops and the loss is reported once (the
  guard's ``on_lease_lost``). The holder's ``complete`` is refused too (``lease_lost``), so a
  result is never stored over the one of whoever took the token over;
- a store that cannot answer (``ServiceUnavailable`` after the client's retries) is logged and
  tried again at the next tick: the lease may still be saved, and if not, the next renewal says so.

The next renewal is due a third of a lease after the previous one was *sent* (the lease was
extended no earlier than that), on the monotonic clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from token_service.errors import LeaseLost, TokenError, TokenInvalid

__all__ = [
    "SCHEDULER",
    "AsyncLeaseRenewer",
    "AsyncRenewal",
    "LeaseRenewer",
    "Renewal",
    "RenewalScheduler",
    "interval_for",
    "renew_on_loop",
    "settle_pause",
]

log = logging.getLogger(__name__)

# Refusals that mean the lease is gone for good.
LOST: tuple[type[TokenError], ...] = (LeaseLost, TokenInvalid)
MIN_INTERVAL_SECONDS = 0.05
THREAD_NAME = "token-lease-renewer"
SCHEDULER_THREAD_NAME = "token-lease-scheduler"


# Storing an outcome the store could not take is tried again after these pauses (doubling), for
# as long as the lease can be held: up to a tenth of the lease (at most 1 s) before it ends.
FIRST_SETTLE_PAUSE_SECONDS = 0.05
MAX_SETTLE_PAUSE_SECONDS = 1.0
MAX_SETTLE_MARGIN_SECONDS = 1.0


def interval_for(lease_seconds: float) -> float:
    """How often to renew a lease of that length: three times per lease."""
    return max(MIN_INTERVAL_SECONDS, lease_seconds / 3)


def settle_pause(left_seconds: float, lease_seconds: float, failures: int) -> float | None:
    """The one rule of every holder whose work ran (a guard, an Idempotency-Key's request) for an
    outcome the store could not take: after ``failures`` tries, with ``left_seconds`` of a
    ``lease_seconds`` lease left (counted on the monotonic clock from the last claim or renewal
    the store acknowledged), how long to wait before the next; None when the lease can no longer
    be held, and the outcome is not recorded."""
    left = left_seconds - min(MAX_SETTLE_MARGIN_SECONDS, lease_seconds / 10)
    if left <= 0:
        return None
    pause: float = FIRST_SETTLE_PAUSE_SECONDS * 2.0 ** min(failures - 1, 16)
    return min(pause, MAX_SETTLE_PAUSE_SECONDS, left)


class Renewable(Protocol):
    """What is renewed: a guard, or a :class:`LeaseRenewer` (whose ``_renew_lease`` may return an
    awaitable: the async renewals await it)."""

    def _renew_lease(self) -> Any: ...  # raises a LOST error once the lease is gone
    def _lost(self, exc: TokenError) -> None: ...  # the lease is gone: report it (once)
    def _renew_failed(self, exc: TokenError) -> None: ...  # the store could not answer


class _Renewals:
    """What one lease's renewals keep on either clock (:class:`Renewal`, :class:`AsyncRenewal`):
    the target, weakly when asked to (a guard: dropped unsettled, it stops being renewed),
    how many renewals Redis acknowledged, and the loss."""

    __slots__ = ("_target", "_weak", "interval_seconds", "lost", "renewals", "stopped")

    def __init__(self, target: Renewable, interval_seconds: float, weak: bool) -> None:
        self._target: Any = weakref.ref(target) if weak else target
        self._weak = weak
        self.interval_seconds = interval_seconds
        self.stopped = False
        self.renewals = 0
        self.lost: TokenError | None = None

    def target(self) -> Renewable | None:
        return self._target() if self._weak else self._target  # type: ignore[no-any-return]

    def _goes_on(self, target: Renewable, exc: Exception | None) -> bool:
        """A renewal came back, having raised ``exc`` (None: acknowledged): whether to schedule the next."""
        if exc is None:
            self.renewals += 1
        elif isinstance(exc, LOST):
            if not self.stopped:  # after stop, a lost lease was settled on purpose: nothing to report
                self.lost = exc
                _report(target._lost, exc)
            return False
        elif isinstance(exc, TokenError):
            log.warning("could not renew a lease (will try again): %s", exc)
            _report(target._renew_failed, exc)
        else:  # keep renewing: losing the lease is worse
            log.error("renewing a lease raised", exc_info=exc)
        return not self.stopped


def _report(callback: Callable[[TokenError], Any], exc: TokenError) -> None:
    try:
        callback(exc)
    except Exception:  # a broken callback must not end renewing silently
        log.exception("a lease renewal callback raised")


class Renewal(_Renewals):
    """One lease's renewals on the :class:`RenewalScheduler`: :meth:`stop` ends them."""

    __slots__ = ("_thread",)

    def __init__(self, target: Renewable, interval_seconds: float, weak: bool) -> None:
        super().__init__(target, interval_seconds, weak)
        # the thread running this lease's renewal right now (None: none ran yet)
        self._thread: threading.Thread | None = None

    def stop(self, timeout_seconds: float | None = 5.0) -> None:
        """Stop renewing; waits (up to ``timeout_seconds``) for a renewal in flight."""
        # Set before reading _thread, while the scheduler sets _thread before its thread reads
        # stopped: either this sees the thread and waits for it, or that thread sees stopped.
        self.stopped = True
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return
        try:
            thread.join(timeout_seconds)
        except RuntimeError:
            # made but not started yet (the scheduler sets _thread first): once it runs it reads
            # stopped, set above, and renews nothing, so there is nothing to wait for
            if thread.ident is not None:
                raise


class RenewalScheduler:
    """The renewals of a process's sync code: a heap of deadlines kept by one daemon thread.

    :meth:`schedule` pushes a lease's first renewal; a renewal that falls due
    runs on a thread of its own (see the module docs) and pushes the next one.
    Stopped renewals are popped without running whenever the thread wakes up,
    however far off they were due (but the last, which it sleeps towards), so
    the heap holds about as many entries as guarded calls start in a third of a
    lease, and the thread wakes about once a third of a lease: a push wakes it
    only when due before whatever it sleeps towards (the first push after an
    idle spell, a lease shorter than the others), never once per call.
    """

    def __init__(self) -> None:
        self._reset()
        # for tests: renewal threads started (not the scheduler's own), and pushes that woke it
        self.threads_started = 0
        self.wakeups = 0

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Renewal]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        # A push due before this wakes the thread: what it sleeps towards while it waits
        # (infinity: an empty heap), -infinity while it is awake (it reads the heap anyway).
        self._wake_before = -math.inf

    def forget(self) -> None:
        """In a forked child: start over, empty (the parent's leases are the parent's to renew)."""
        self._reset()

    def schedule(self, target: Renewable, interval_seconds: float, *, weak: bool = True) -> Renewal:
        """Renew ``target`` every ``interval_seconds`` from now until the returned renewal is stopped."""
        renewal = Renewal(target, interval_seconds, weak)
        self._push(renewal, time.monotonic() + interval_seconds)
        return renewal

    def _push(self, renewal: Renewal, due: float) -> None:
        entry = (due, next(self._seq), renewal)
        with self._cond:
            heapq.heappush(self._heap, entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=SCHEDULER_THREAD_NAME, daemon=True)
                self._thread.start()
            elif due < self._wake_before:  # rare: the thread sleeps towards a later deadline
                self.wakeups += 1
                self._cond.notify()

    def pending(self) -> int:
        """Renewals on the heap that are not stopped (what a forked child must see as 0)."""
        with self._cond:
            return sum(1 for _, _, renewal in self._heap if not renewal.stopped)

    def _loop(self) -> None:
        cond = self._cond  # a forked child replaces it: this thread does not exist there
        heap = self._heap
        due_now: list[Renewal] = []
        while True:
            with cond:
                self._wake_before = -math.inf  # awake: it reads the heap before it sleeps again
                while True:
                    now = time.monotonic()
                    while heap:
                        due, _, renewal = heap[0]
                        if due <= now:
                            heapq.heappop(heap)
                            if not renewal.stopped:
                                due_now.append(renewal)
                        elif renewal.stopped and len(heap) > 1:
                            heapq.heappop(heap)  # ended before it was due: forget it now
                        else:
                            # The last stopped entry stays, to sleep towards: every call pushes a
                            # renewal due later than it, so none of them has to wake this thread.
                            break
                    if due_now:
                        break
                    self._wake_before = heap[0][0] if heap else math.inf
                    cond.wait(heap[0][0] - now if heap else None)
                    self._wake_before = -math.inf
            for renewal in due_now:
                self._start(renewal)
            due_now.clear()

    def _start(self, renewal: Renewal) -> None:
        if renewal.target() is None:
            return  # its guard was dropped unsettled and collected: nothing renews it any more
        thread = threading.Thread(target=self._renew, args=(renewal,), name=THREAD_NAME, daemon=True)
        renewal._thread = thread  # before the thread reads stopped: see Renewal.stop
        self.threads_started += 1
        thread.start()

    def _renew(self, renewal: Renewal) -> None:
        target = renewal.target()
        if target is None or renewal.stopped:
            return
        sent_at = time.monotonic()
        failed: Exception | None = None
        try:
            target._renew_lease()
        except Exception as exc:
            failed = exc
        if renewal._goes_on(target, failed):
            self._push(renewal, sent_at + renewal.interval_seconds)


SCHEDULER = RenewalScheduler()
# a forked child must never renew its parent's leases: it starts over, empty
os.register_at_fork(after_in_child=SCHEDULER.forget)


# -- asyncio: the event loop's own timer heap ---------------------------------------------------


class AsyncRenewal(_Renewals):
    """One lease's renewals on its event loop: a timer (``loop.call_at``), then a task per renewal."""

    __slots__ = ("_loop", "_task", "_timer")

    def __init__(self, target: Renewable, interval_seconds: float, weak: bool) -> None:
        super().__init__(target, interval_seconds, weak)
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    def _at(self, when: float) -> None:
        self._timer = self._loop.call_at(when, self._due)

    def _due(self) -> None:
        self._timer = None
        if self.stopped or self.target() is None:
            return  # stopped, or its guard was dropped unsettled and collected
        self._task = self._loop.create_task(self._renew(), name=THREAD_NAME)

    async def _renew(self) -> None:
        target = self.target()
        if target is None or self.stopped:
            return
        sent_at = self._loop.time()
        failed: Exception | None = None
        try:
            await target._renew_lease()
        except Exception as exc:
            failed = exc
        if self._goes_on(target, failed):
            self._at(sent_at + self.interval_seconds)

    async def stop(self) -> None:
        """Stop renewing; a renewal in flight is cancelled (and awaited)."""
        self.stopped = True
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        task, self._task = self._task, None
        if task is None or task.done() or task is asyncio.current_task():
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def renew_on_loop(target: Renewable, interval_seconds: float, *, weak: bool = True) -> AsyncRenewal:
    """Renew ``target`` every ``interval_seconds`` on the running loop until the renewal is stopped."""
    renewal = AsyncRenewal(target, interval_seconds, weak)
    renewal._at(renewal._loop.time() + interval_seconds)
    return renewal


# -- a renewal of two callables: the Idempotency-Key middlewares' lock ---------------------------


class _Callables:
    """A :class:`Renewable` made of ``renew`` (an awaitable for :class:`AsyncLeaseRenewer`) and
    ``on_lost(error)``, called once when a renewal is refused for good."""

    def __init__(
        self,
        renew: Callable[[], Any],
        interval_seconds: float,
        *,
        on_lost: Callable[[TokenError], Any] | None = None,
    ) -> None:
        self._renew_lease = renew
        self.interval_seconds = interval_seconds
        self._on_lost = on_lost

    _renewal: _Renewals | None = None

    @property
    def renewals(self) -> int:
        return self._renewal.renewals if self._renewal is not None else 0

    @property
    def lost(self) -> TokenError | None:
        return self._renewal.lost if self._renewal is not None else None

    def _lost(self, exc: TokenError) -> None:
        if self._on_lost is not None:
            self._on_lost(exc)

    def _renew_failed(self, exc: TokenError) -> None:
        pass  # logged by the renewal; renewing goes on


class LeaseRenewer(_Callables):
    """Calls ``renew()`` every ``interval_seconds`` until :meth:`stop`, on the process's scheduler."""

    _renewal: Renewal | None = None

    def start(self) -> LeaseRenewer:
        self._renewal = SCHEDULER.schedule(self, self.interval_seconds, weak=False)
        return self

    def stop(self, timeout_seconds: float | None = 5.0) -> None:
        if self._renewal is not None:
            self._renewal.stop(timeout_seconds)


class AsyncLeaseRenewer(_Callables):
    """:class:`LeaseRenewer` for asyncio: ``await renew()`` every ``interval_seconds``, on its loop."""

    _renewal: AsyncRenewal | None = None

    def start(self) -> AsyncLeaseRenewer:
        self._renewal = renew_on_loop(self, self.interval_seconds, weak=False)
        return self

    async def stop(self) -> None:
        if self._renewal is not None:
            await self._renewal.stop()
