"""Keep a lease alive while the guarded work runs.

A guard's lease (or an Idempotency-Key's lock) is taken for ``lease_seconds``
so that a holder that dies frees the token on its own. Work that may take
longer would lose its lease half-way, and a duplicate would run it again. A
renewer extends the lease every third of its length, in the background,
until the work settles:

- sync code gets a daemon thread (:class:`LeaseRenewer`; started only once the
  first renewal is due, so work that ends sooner costs no thread), asyncio code
  a task (:class:`AsyncLeaseRenewer`); both are stopped before ``complete`` / ``fail``;
- a process that dies takes its renewer with it: nothing renews any more, and
  the lease runs out exactly as it would without renewal;
- a renewal refused because the lease is no longer the live one (it ran out
  while the process was stalled, or the token was revoked) is final: the
  renewer stops and reports it once through ``on_lost``. The holder's
  ``complete`` is refused too (``lease_lost``), so a result is never stored
  over the one of whoever took the token over;
- a store that cannot answer (``ServiceUnavailable`` after the client's
  retries) is logged and tried again at the next tick: the lease may still be
  saved, and if not, the next renewal reports it lost.

The renewer holds no reference to its guard, so a guard dropped without being
settled stops its renewer when it is garbage-collected.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from token_service.errors import LeaseLost, TokenError, TokenInvalid

log = logging.getLogger(__name__)

# Refusals that mean the lease is gone for good.
LOST: tuple[type[TokenError], ...] = (LeaseLost, TokenInvalid)
MIN_INTERVAL_SECONDS = 0.05


def interval_for(lease_seconds: float) -> float:
    """How often to renew a lease of that length: three times per lease."""
    return max(MIN_INTERVAL_SECONDS, lease_seconds / 3)


def _report(on_lost: Callable[[TokenError], Any] | None, exc: TokenError) -> None:
    if on_lost is None:
        return
    try:
        on_lost(exc)
    except Exception:  # a broken callback must not kill the renewer silently
        log.exception("the lease-lost callback raised")


class _Starter:
    """One daemon thread per process that starts a renewer's own thread when its first renewal is due.

    Most guarded work finishes well within a third of its lease: its renewer is
    stopped before it ever renews, and costs a heap entry instead of a thread.
    Work that runs longer gets its own thread from then on, so one slow store
    call never delays another lease's renewal.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, LeaseRenewer]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        # a forked child must never renew its parent's leases: it starts over, empty
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._cond = threading.Condition()
        self._due = []
        self._thread = None

    def schedule(self, renewer: LeaseRenewer, delay_seconds: float) -> None:
        entry = (time.monotonic() + delay_seconds, next(self._seq), renewer)
        with self._cond:
            heapq.heappush(self._due, entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="token-lease-starter", daemon=True)
                self._thread.start()
            if self._due[0] is entry:  # due before whatever the thread sleeps towards: wake it
                self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._due:
                    self._cond.wait()
                due, _, renewer = self._due[0]
                wait = due - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._due)
            renewer._due()


_STARTER = _Starter()


class _Renewals:
    """What both renewers do with a renewal that raised."""

    lost: TokenError | None
    _on_lost: Callable[[TokenError], Any] | None
    _on_error: Callable[[TokenError], Any] | None

    def _failed(self, exc: Exception, *, settled: bool = False) -> bool:
        """Whether renewing ends: only when the lease is lost (reported unless it was ``settled``)."""
        if isinstance(exc, LOST):
            if not settled:
                self.lost = exc
                _report(self._on_lost, exc)
            return True
        if isinstance(exc, TokenError):
            log.warning("could not renew a lease (will try again): %s", exc)
            _report(self._on_error, exc)
        else:  # keep renewing: losing the lease is worse
            log.error("renewing a lease raised", exc_info=exc)
        return False


class LeaseRenewer(_Renewals):
    """Calls ``renew()`` every ``interval_seconds`` until :meth:`stop`, on a daemon thread of its own
    once the first renewal is due (work that ends sooner never starts one)."""

    def __init__(
        self,
        renew: Callable[[], Any],
        interval_seconds: float,
        *,
        on_lost: Callable[[TokenError], Any] | None = None,
        on_error: Callable[[TokenError], Any] | None = None,
        name: str = "token-lease-renewer",
    ) -> None:
        self._renew = renew
        self.interval_seconds = interval_seconds
        self._on_lost = on_lost
        self._on_error = on_error
        self._name = name
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        # reentrant: a guard collected while its renewer starts stops it from within (finalizer)
        self._lock = threading.RLock()
        self.renewals = 0
        self.lost: TokenError | None = None

    def start(self) -> LeaseRenewer:
        _STARTER.schedule(self, self.interval_seconds)
        return self

    def _due(self) -> None:
        with self._lock:
            if self._stopped.is_set():
                return
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()

    def stop(self, timeout_seconds: float | None = 5.0) -> None:
        """Stop renewing; waits (up to ``timeout_seconds``) for a renewal in flight."""
        with self._lock:
            self._stopped.set()
            thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout_seconds)

    def _loop(self) -> None:
        while True:
            try:
                self._renew()
            except Exception as exc:
                # after stop, a lost lease was settled on purpose: nothing to report
                if self._failed(exc, settled=self._stopped.is_set()):
                    return
            else:
                self.renewals += 1
            if self._stopped.wait(self.interval_seconds):
                return


class AsyncLeaseRenewer(_Renewals):
    """:class:`LeaseRenewer` as an asyncio task: ``await renew()`` every ``interval_seconds``."""

    def __init__(
        self,
        renew: Callable[[], Awaitable[Any]],
        interval_seconds: float,
        *,
        on_lost: Callable[[TokenError], Any] | None = None,
        on_error: Callable[[TokenError], Any] | None = None,
    ) -> None:
        self._renew = renew
        self.interval_seconds = interval_seconds
        self._on_lost = on_lost
        self._on_error = on_error
        self._task: asyncio.Task[None] | None = None
        self.renewals = 0
        self.lost: TokenError | None = None

    def start(self) -> AsyncLeaseRenewer:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="token-lease-renewer")
        return self

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None or task.done():
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def stop_nowait(self) -> None:
        """Cancel without waiting (for a guard collected without being settled)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            with contextlib.suppress(RuntimeError):  # the loop is already closed: so is the task
                task.get_loop().call_soon_threadsafe(task.cancel)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_seconds)
            try:
                await self._renew()
            except Exception as exc:
                if self._failed(exc):
                    return
            else:
                self.renewals += 1
