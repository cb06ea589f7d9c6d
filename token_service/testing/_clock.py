"""The store's clock in a test: real time plus an offset that only :meth:`StoreClock.advance` moves.

The in-memory store reads this clock wherever Redis reads its own: for key
expiry (a token's TTL, a finished record's ``result_ttl_seconds``, an
Idempotency-Key's stored response) and for the ``TIME`` the Lua scripts take
their "now" from (leases). Moving it forward is time passing for the store,
with no sleeping; it never moves back.
"""

from __future__ import annotations

import math
import threading
import time
from datetime import timedelta

__all__ = ["StoreClock"]

# How far ahead the store's time may go: Redis keeps expiries as milliseconds in 64 bits, and
# fakeredis refuses an expiry past that; a century is far beyond any TTL the API accepts.
MAX_OFFSET_SECONDS = 100 * 365 * 86400


def _seconds(value: object) -> float:
    """``value`` as a number of seconds to move forward, or the error that says what is wrong."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    # bool is an int to Python, never a duration to a reader: advance(True) is a slip
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(
            f"token_clock.advance() takes a number of seconds (int, float or timedelta), "
            f"not {type(value).__name__}: {value!r}"
        )
    seconds = float(value)
    if not math.isfinite(seconds):
        raise ValueError(f"token_clock.advance({value!r}): the seconds must be a finite number")
    if seconds < 0:
        raise ValueError(
            f"token_clock.advance({value!r}): the store's time only moves forward, as Redis's does "
            "(a test that needs an earlier time makes its tokens later instead)"
        )
    return seconds


class StoreClock:
    """The in-memory store's time: this host's clock plus what :meth:`advance` added.

    Safe from any thread: an advance is seen whole by every command after it, and
    never in the middle of one (a Lua script runs on one "now").
    """

    def __init__(self, lock: threading.Lock | None = None) -> None:
        # the store's command lock: an advance waits for the command in progress
        self._lock = lock if lock is not None else threading.Lock()
        self._offset_seconds = 0.0

    @property
    def offset_seconds(self) -> float:
        """How far the store's time is ahead of this host's: the sum of every advance since the test began."""
        return self._offset_seconds

    def now(self) -> float:
        """The store's time, in seconds since the epoch (what ``TIME`` answers)."""
        return time.time() + self._offset_seconds

    def advance(self, seconds: float | timedelta) -> None:
        """Move the store's time forward by ``seconds``: whatever would expire meanwhile has expired.

        Tokens past their ``ttl_seconds`` are gone (``TokenInvalid``), leases past
        their ``lease_seconds`` can be taken over, stored results past
        ``result_ttl_seconds`` are forgotten. A guard whose block is running when
        time moves does not renew meanwhile: to the store it is a holder that
        stalled that long (its ``complete`` then raises ``LeaseLost`` if its lease
        ran out), as a process paused for that time would be.
        """
        step = _seconds(seconds)
        with self._lock:
            if self._offset_seconds + step > MAX_OFFSET_SECONDS:
                raise ValueError(
                    f"token_clock.advance({seconds!r}): the store's time would be more than a century "
                    "ahead of this host's, past what Redis can count"
                )
            self._offset_seconds += step

    def _reset(self) -> None:
        with self._lock:
            self._offset_seconds = 0.0
