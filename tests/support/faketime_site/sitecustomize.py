"""Loaded by every Python process the clock-skew tests start under ``faketime``
(``PYTHONPATH`` names this directory: :func:`tests.support.skew.faketime_env`).

libfaketime 0.9.10 (Debian's) breaks Python 3.11's ``time.sleep`` when the
monotonic clock is left alone: it rewrites the deadline of
``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`` and the kernel answers
EINVAL (wolfcw/libfaketime#426). A timed wait on an Event sleeps the same
duration on the same monotonic clock.
"""

import os
import threading
import time

if os.environ.get("FAKETIME_DONT_FAKE_MONOTONIC") == "1":

    def _sleep(seconds: float) -> None:
        threading.Event().wait(seconds)

    time.sleep = _sleep
