"""What the SDK's methods return, and how it retries.

The reply values are the store's own (:mod:`token_service.records`), so a reply reads the same
over HTTP and straight from Redis; only an issued token and :class:`TokenInfo` (absolute times
instead of a Redis TTL) are shaped here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from token_service.records import Completed, Consumed, FailRecorded, Finished, Renewed, Started

__all__ = [
    "Completed",
    "Consumed",
    "FailRecorded",
    "Finished",
    "IssuedToken",
    "Renewed",
    "RetryPolicy",
    "Started",
    "TokenInfo",
]


@dataclass(frozen=True, slots=True)
class IssuedToken:
    # expires_at is for display (the service's clock, or this host's on the direct
    # transport); ttl_seconds is the duration to count on a monotonic clock
    token: str
    scope: str
    subject: str | None
    fingerprint: str | None
    ttl_seconds: int
    expires_at: datetime

    def __repr__(self) -> str:
        # the token is a secret: keep it out of logs and tracebacks
        return (
            f"IssuedToken(token='***', scope={self.scope!r}, subject={self.subject!r}, "
            f"fingerprint={self.fingerprint!r}, ttl_seconds={self.ttl_seconds}, "
            f"expires_at={self.expires_at.isoformat()})"
        )


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """``verify``'s answer: a token's state, bindings and stored outcome. Changes nothing.

    ``expires_at`` and ``lease_expires_at`` are for display: the store's clock (or, on
    the direct transport, this host's clock plus the time Redis says is left). No
    decision of the SDK compares them with this host's clock, and neither should yours.
    """

    state: str
    scope: str
    subject: str | None
    fingerprint: str | None
    expires_at: datetime
    lease_expires_at: datetime | None = None
    result: Any = None
    error: Any = None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries of transport failures (connection errors, timeouts, 503).

    ``attempts`` counts the first try. The ceiling of the n-th wait grows from
    ``backoff_seconds`` by ``multiplier`` up to ``max_backoff_seconds``; the wait
    itself is drawn between half the ceiling and the ceiling ("equal jitter"):
    many clients that lost the same Redis do not come back in step, and none
    comes back at once.
    """

    attempts: int = 4
    backoff_seconds: float = 0.05
    multiplier: float = 2.0
    max_backoff_seconds: float = 1.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")

    def delay_seconds(self, failures: int) -> float:
        ceiling = min(self.max_backoff_seconds, self.backoff_seconds * self.multiplier ** (failures - 1))
        return random.uniform(ceiling / 2, ceiling)
