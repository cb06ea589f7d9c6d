"""A store clock behind Redis's: how the ops tests make a begin whose holder "died" long ago."""

from __future__ import annotations

import time
from collections.abc import Callable


def past_clock(seconds_ago: float) -> Callable[[], int]:
    """A store clock that many seconds behind: a lease it grants has already run out by Redis's."""
    return lambda: int((time.time() - seconds_ago) * 1000)
