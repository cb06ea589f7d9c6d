"""Keep a lease alive while the guarded work runs.

A guard's lease (or an Idempotency-Key's lock) is taken for ``lease_seconds``
so that a holder that dies frees the token on its own. Work that may take
longer would lose its lease half-way, and a duplicate would run it again. A
renewer extends the lease every third of its length, in the background,
until the work settles:

- sync code gets a daemon thread (:class:`LeaseRenewer`), asyncio code a task
  (:class:`AsyncLeaseRenewer`); both are stopped before ``complete`` / ``fail``;
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
import logging
import threading
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


class LeaseRenewer:
    """Calls ``renew()`` every ``interval_seconds`` on a daemon thread until :meth:`stop`."""

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
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.renewals = 0
        self.lost: TokenError | None = None

    def start(self) -> LeaseRenewer:
        self._thread.start()
        return self

    def stop(self, timeout_seconds: float | None = 5.0) -> None:
        """Stop renewing; waits (up to ``timeout_seconds``) for a renewal in flight."""
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_seconds)

    def _loop(self) -> None:
        while not self._stopped.wait(self.interval_seconds):
            try:
                self._renew()
            except LOST as exc:
                if not self._stopped.is_set():  # after stop, the lease was settled on purpose
                    self.lost = exc
                    _report(self._on_lost, exc)
                return
            except TokenError as exc:
                log.warning("could not renew a lease (will try again): %s", exc)
                _report(self._on_error, exc)
            except Exception:  # keep renewing: losing the lease is worse
                log.exception("renewing a lease raised")
            else:
                self.renewals += 1


class AsyncLeaseRenewer:
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
            except LOST as exc:
                self.lost = exc
                _report(self._on_lost, exc)
                return
            except TokenError as exc:
                log.warning("could not renew a lease (will try again): %s", exc)
                _report(self._on_error, exc)
            except Exception:  # keep renewing: losing the lease is worse
                log.exception("renewing a lease raised")
            else:
                self.renewals += 1
