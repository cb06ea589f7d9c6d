"""One deadline per call: the time a caller gave a whole operation, on the monotonic clock.

A call that may try Redis several times (the SDK's retries, redis-py's own
retry, a reconnect and its handshake, a wait for a pooled connection) sets
its deadline once, from the moment it starts (:class:`within`); every step
under it asks :func:`remaining_seconds` and waits no longer than that
(:mod:`token_service.connection` clamps each connect, send, read and pool
wait to it). A budget that is spent ends the call instead of starting another
step. Inside a deadline a nested one can only shorten it.

The service gives each request a budget for Redis that starts at the
request's first Redis step (:class:`from_first_use`), so that a client that
sends its body slowly does not spend it.

Context variables, so each thread, greenlet (gevent workers) and asyncio task
has its own deadline and none leaks into another's calls.
"""

from __future__ import annotations

import time
from contextvars import ContextVar, Token

__all__ = ["from_first_use", "remaining_seconds", "within"]

_deadline: ContextVar[float | None] = ContextVar("token_service_deadline", default=None)
# A budget not started yet (from_first_use): its deadline is set when a step first asks.
_pending: ContextVar[float | None] = ContextVar("token_service_pending_budget", default=None)


def remaining_seconds() -> float | None:
    """Seconds left of the current deadline (0 or less: spent), or None when there is none."""
    deadline = _deadline.get()
    if deadline is None:
        pending = _pending.get()
        if pending is None:
            return None
        _deadline.set(time.monotonic() + pending)  # undone when from_first_use exits
        return pending
    return deadline - time.monotonic()


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
        left = remaining_seconds()  # an outer deadline, started now if it was waiting
        if left is not None and left < self._seconds:
            deadline = time.monotonic() + left
        self._token = _deadline.set(deadline)
        return deadline

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None:
            _deadline.reset(self._token)
            self._token = None


class from_first_use:
    """``with from_first_use(seconds):`` -- the Redis steps inside share one budget of
    ``seconds``, counted from the first of them that asks (none: nothing is counted).

    Inside a deadline it is that deadline (a budget can only shorten a call).
    """

    __slots__ = ("_deadline_token", "_pending_token", "_seconds")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._pending_token: Token[float | None] | None = None
        self._deadline_token: Token[float | None] | None = None

    def __enter__(self) -> None:
        # set both, so that exiting undoes a deadline the first step set meanwhile
        self._deadline_token = _deadline.set(_deadline.get())
        self._pending_token = _pending.set(self._seconds)

    def __exit__(self, *exc_info: object) -> None:
        if self._pending_token is not None and self._deadline_token is not None:
            _pending.reset(self._pending_token)
            _deadline.reset(self._deadline_token)
            self._pending_token = self._deadline_token = None
