"""Keep a lease alive while the guarded work runs.

A guard's lease (or an Idempotency-Key's lock) is taken for ``lease_seconds``
so that a holder that dies frees the token on its own. Work that may take
longer would lose its lease half-way, and a duplicate would run it again. The
lease is renewed every third of its length, in the background, until the work
settles:

- **one scheduler per process** keeps the time of every renewal of sync code:
  a heap of deadlines and one daemon thread, created with the first lease. A
  call whose work ends before its first renewal is due costs a heap push and a
  stop flag: no thread, lock object or finalizer of its own. The heap is shared
  by every client and guard; its thread never calls the store. Each renewal
  that falls due runs on a short-lived thread of its own, so a store call that
  hangs (a Redis that stopped answering, up to the client's timeout and
  retries) never delays another lease's renewal; threads exist only while
  renewals are in flight (a long-running lease starts one every third of its
  length, and it ends with the call);
- asyncio code is scheduled on its **event loop's own timer heap**
  (``loop.call_at``, cancelled on stop: a scheduler per loop, which dies with
  the loop); a renewal that falls due runs as a task of that loop;
- a guard's renewals go on while its outcome is stored (``complete`` /
  ``fail``, tried again while the store cannot answer and the lease can be
  held: :mod:`token_service.client.guard`), and stop once it is: a renewal
  that lands after the outcome is refused by Redis and means nothing (the
  guard ignores a loss reported while it settles; the settle's own reply
  tells). The Idempotency-Key middlewares' :class:`LeaseRenewer` likewise
  runs until their outcome is stored (:func:`settle_pause` is the rule for how
  long both keep trying); stopping does not wait for a renewal in flight;
- the scheduler holds its guards weakly: a guard dropped without being settled
  is garbage-collected, and its next renewal finds it gone and ends;
- a process that dies takes its scheduler with it: nothing renews any more, and
  the lease runs out exactly as it would without renewal. A forked child starts
  with an empty schedule: it never renews its parent's leases;
- a renewal refused because the lease is no longer the live one (it ran out
  while the process was stalled, or the token was revoked) is final: renewing
  stops and the loss is reported once (the guard's ``on_lease_lost``). The
  holder's ``complete`` is refused too (``lease_lost``), so a result is never
  stored over the one of whoever took the token over;
- a store that cannot answer (``ServiceUnavailable`` after the client's
  retries) is logged and tried again at the next tick: the lease may still be
  saved, and if not, the next renewal reports it lost.

The next renewal is due a third of a lease after the previous one was *sent*
(the lease was extended no earlier than that), on the monotonic clock.
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
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

from token_service.errors import LeaseLost, TokenError, TokenInvalid

__all__ = [
    "FIRST_SETTLE_PAUSE_SECONDS",
    "LOST",
    "MAX_SETTLE_MARGIN_SECONDS",
    "MAX_SETTLE_PAUSE_SECONDS",
    "MIN_INTERVAL_SECONDS",
    "SCHEDULER",
    "SCHEDULER_THREAD_NAME",
    "THREAD_NAME",
    "AsyncLeaseRenewer",
    "AsyncRenewable",
    "AsyncRenewal",
    "LeaseRenewer",
    "Renewable",
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


def _report(callback: Callable[[TokenError], Any], exc: TokenError) -> None:
    try:
        callback(exc)
    except Exception:  # a broken callback must not end renewing silently
        log.exception("a lease renewal callback raised")


class Renewable(Protocol):
    """What the scheduler renews: a guard, or a :class:`LeaseRenewer` around three callables."""

    def _renew_lease(self) -> Any: ...  # raises a LOST error once the lease is gone
    def _lost(self, exc: TokenError) -> None: ...  # the lease is gone: report it (once)
    def _renew_failed(self, exc: TokenError) -> None: ...  # the store could not answer


class AsyncRenewable(Protocol):
    def _renew_lease(self) -> Awaitable[Any]: ...
    def _lost(self, exc: TokenError) -> None: ...
    def _renew_failed(self, exc: TokenError) -> None: ...


def _failed(renewal: Renewal | AsyncRenewal, target: Any, exc: Exception) -> bool:
    """What a renewal that raised means: True when renewing ends (the lease is lost)."""
    if isinstance(exc, LOST):
        if not renewal.stopped:  # after stop, a lost lease was settled on purpose: nothing to report
            renewal.lost = exc
            _report(target._lost, exc)
        return True
    if isinstance(exc, TokenError):
        log.warning("could not renew a lease (will try again): %s", exc)
        _report(target._renew_failed, exc)
    else:  # keep renewing: losing the lease is worse
        log.error("renewing a lease raised", exc_info=exc)
    return False


class Renewal:
    """One lease's renewals on the :class:`RenewalScheduler`: :meth:`stop` ends them.

    Holds its target weakly when asked to (a guard: dropped unsettled, it stops
    being renewed), strongly otherwise (a :class:`LeaseRenewer`).
    """

    __slots__ = ("_target", "_thread", "_weak", "interval_seconds", "lost", "renewals", "stopped")

    def __init__(self, target: Renewable, interval_seconds: float, weak: bool) -> None:
        self._target: Any = weakref.ref(target) if weak else target
        self._weak = weak
        self.interval_seconds = interval_seconds
        self.stopped = False
        # the thread running this lease's renewal right now (None: none ran yet)
        self._thread: threading.Thread | None = None
        self.renewals = 0
        self.lost: TokenError | None = None

    def target(self) -> Renewable | None:
        return self._target() if self._weak else self._target  # type: ignore[no-any-return]

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
        try:
            target._renew_lease()
        except Exception as exc:
            if _failed(renewal, target, exc):
                return
        else:
            renewal.renewals += 1
        if not renewal.stopped:
            self._push(renewal, sent_at + renewal.interval_seconds)


SCHEDULER = RenewalScheduler()
# a forked child must never renew its parent's leases: it starts over, empty
os.register_at_fork(after_in_child=SCHEDULER.forget)


ReplyT = TypeVar("ReplyT")
RenewalT = TypeVar("RenewalT", "Renewal", "AsyncRenewal")


class _LeaseRenewerBase(Generic[ReplyT, RenewalT]):
    """What :class:`LeaseRenewer` and :class:`AsyncLeaseRenewer` share: a ``renew`` callable and
    its two callbacks, handed to a renewal (the process's scheduler or the running loop) that
    counts renewals and keeps the loss; the subclasses only start and stop it."""

    def __init__(
        self,
        renew: Callable[[], ReplyT],
        interval_seconds: float,
        *,
        on_lost: Callable[[TokenError], Any] | None = None,
        on_error: Callable[[TokenError], Any] | None = None,
    ) -> None:
        self._renew = renew
        self.interval_seconds = interval_seconds
        self._on_lost = on_lost
        self._on_error = on_error
        self._renewal: RenewalT | None = None

    @property
    def renewals(self) -> int:
        return self._renewal.renewals if self._renewal is not None else 0

    @property
    def lost(self) -> TokenError | None:
        return self._renewal.lost if self._renewal is not None else None

    def _renew_lease(self) -> ReplyT:
        return self._renew()

    def _lost(self, exc: TokenError) -> None:
        if self._on_lost is not None:
            self._on_lost(exc)

    def _renew_failed(self, exc: TokenError) -> None:
        if self._on_error is not None:
            self._on_error(exc)


class LeaseRenewer(_LeaseRenewerBase[Any, "Renewal"]):
    """Calls ``renew()`` every ``interval_seconds`` until :meth:`stop`, on the process's scheduler.

    ``on_lost(error)`` is called once when a renewal is refused for good,
    ``on_error(error)`` when the store could not answer (renewing goes on).
    """

    def start(self) -> LeaseRenewer:
        self._renewal = SCHEDULER.schedule(self, self.interval_seconds, weak=False)
        return self

    def stop(self, timeout_seconds: float | None = 5.0) -> None:
        if self._renewal is not None:
            self._renewal.stop(timeout_seconds)


# -- asyncio: the event loop's own timer heap ---------------------------------------------------


class AsyncRenewal:
    """One lease's renewals on its event loop: a timer (``loop.call_at``), then a task per renewal."""

    __slots__ = (
        "_loop",
        "_target",
        "_task",
        "_timer",
        "_weak",
        "interval_seconds",
        "lost",
        "renewals",
        "stopped",
    )

    def __init__(self, target: AsyncRenewable, interval_seconds: float, weak: bool) -> None:
        self._target: Any = weakref.ref(target) if weak else target
        self._weak = weak
        self.interval_seconds = interval_seconds
        self.stopped = False
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self.renewals = 0
        self.lost: TokenError | None = None

    def target(self) -> AsyncRenewable | None:
        return self._target() if self._weak else self._target  # type: ignore[no-any-return]

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
        try:
            await target._renew_lease()
        except Exception as exc:
            if _failed(self, target, exc):
                return
        else:
            self.renewals += 1
        if not self.stopped:
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


def renew_on_loop(target: AsyncRenewable, interval_seconds: float, *, weak: bool = True) -> AsyncRenewal:
    """Renew ``target`` every ``interval_seconds`` on the running loop until the renewal is stopped."""
    renewal = AsyncRenewal(target, interval_seconds, weak)
    renewal._at(renewal._loop.time() + interval_seconds)
    return renewal


class AsyncLeaseRenewer(_LeaseRenewerBase[Awaitable[Any], "AsyncRenewal"]):
    """:class:`LeaseRenewer` for asyncio: ``await renew()`` every ``interval_seconds``."""

    def start(self) -> AsyncLeaseRenewer:
        self._renewal = renew_on_loop(self, self.interval_seconds, weak=False)
        return self

    async def stop(self) -> None:
        if self._renewal is not None:
            await self._renewal.stop()
