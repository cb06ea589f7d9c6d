"""A reference model of the issuance limits, in plain Python (docs/configuration.md, "Limits").

- Rate: GCRA with a burst of one period. A request for ``count`` tokens is
  refused while ``tat + count·period/limit - period > now``, with a retry after
  that difference (ms, rounded up); admitted, it moves ``tat`` there (kept in
  ns, each step rounded down).
- Outstanding cap: a token counts from its issue until the first consume,
  begin or revoke that finds it ISSUED, or until the end of its bucket:
  ``min(ttl, MAX_COUNTED_SECONDS)`` from issue, rounded up to a multiple of
  the smallest ``5·2^k`` s of at least an eighth of that. A request that would
  take the count over the cap is refused until enough buckets have ended.
- A refusal changes nothing; a rate refusal is decided before the cap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from token_service.limits import MAX_COUNTED_SECONDS

BUCKET_SECONDS = 5


def bucket_end_s(now_ms: int, ttl_seconds: int) -> int:
    counted_ms = min(ttl_seconds, MAX_COUNTED_SECONDS) * 1000
    width = BUCKET_SECONDS
    while width * 8000 < counted_ms:
        width *= 2
    return math.ceil((now_ms + counted_ms) / 1000 / width) * width


@dataclass
class ModelClient:
    tat_ns: int = 0  # the rate limiter's theoretical arrival time, in ns
    # token -> the bucket (end, s) it is still counted in
    counted: dict[str, int] = field(default_factory=dict)

    def outstanding(self, now_ms: int) -> dict[int, int]:
        live: dict[int, int] = {}
        for end in self.counted.values():
            if end * 1000 > now_ms:
                live[end] = live.get(end, 0) + 1
        return live


@dataclass
class LimiterModel:
    limit: int  # 0: no rate limit
    period_ms: int
    cap: int  # 0: no cap
    clients: dict[str, ModelClient] = field(default_factory=dict)

    def admit(self, client: str, count: int, ttl_seconds: int, now_ms: int) -> tuple[object, ...]:
        """('admitted', bucket end or None) | ('rate_limited', retry ms) | ('too_many_outstanding', ms)."""
        state = self.clients.setdefault(client, ModelClient())
        new_tat = None
        if self.limit:
            # in ns ahead of now, rounded down, with the script's double arithmetic
            ahead = max(state.tat_ns - now_ms * 10**6, 0)
            new_ahead = math.floor(ahead + count * self.period_ms * 1e6 / self.limit)
            over = new_ahead - self.period_ms * 10**6
            if over > 0:
                return ("rate_limited", math.ceil(over / 1e6))
            new_tat = now_ms * 10**6 + new_ahead
        live = state.outstanding(now_ms)
        if self.cap and sum(live.values()) + count > self.cap:
            needed = sum(live.values()) + count - self.cap
            for end in sorted(live):
                needed -= live[end]
                if needed <= 0:
                    return ("too_many_outstanding", end * 1000 - now_ms)
        if new_tat is not None:
            state.tat_ns = new_tat
        return ("admitted", bucket_end_s(now_ms, ttl_seconds) if self.cap else None)

    def issued(self, client: str, token: str, bucket: int | None) -> None:
        if bucket is not None:
            self.clients[client].counted[token] = bucket

    def release(self, token: str) -> None:
        """A consume, begin or revoke found the token ISSUED (or it is gone): it counts no more."""
        for state in self.clients.values():
            state.counted.pop(token, None)
