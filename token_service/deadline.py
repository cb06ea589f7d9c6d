"""One deadline per call: the time a caller gave a whole operation, on the monotonic clock.

A call that may try Redis several times (the SDK's retries, redis-py's own
retry, a reconnect and its handshake, a wait for a pooled connection) sets
its deadline once, from the moment it starts (:class:`within`); every step
under it asks :func:`remaining_seconds` and waits no longer than that
(:mod:`token_service.connection` clamps each connect, send, read and pool
wait to it). A budget that is spent ends the call instead of starting another
step. Inside a deadline a nested one can only shorten it.

A context variable, so each thread, greenlet (gevent workers) and asyncio task
has its own deadline and none leaks into another's calls.
"""

from __future__ import annotations

import time
from contextvars import ContextVar, Token

__all__ = ["current", "remaining_seconds", "within"]

_deadline: ContextVar[float | None] = ContextVar("token_service_deadline", default=None)


def remaining_seconds() -> float | None:
    """Seconds left of the current deadline (0 or less: spent), or None when there is none."""
    deadline = _deadline.get()
    return None if deadline is None else deadline - time.monotonic()


def current() -> float | None:
    """The current deadline as a ``time.monotonic()`` value, or None."""
    return _deadline.get()


class within:
    """``with within(seconds):`` -- the code inside must be done ``seconds`` from now.

    A class rather than a generator-based manager: it wraps every SDK call and
    every service request, and costs a fraction of one.
    """

    __slots__ = ("_seconds", "_token")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._token: Token[float | None] | None = None

    def __enter__(self) -> float:
        deadline = time.monotonic() + self._seconds
        outer = _deadline.get()
        if outer is not None and outer < deadline:
            deadline = outer
        self._token = _deadline.set(deadline)
        return deadline

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None:
            _deadline.reset(self._token)
            self._token = None
