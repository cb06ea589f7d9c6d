"""The issuance limiter's bookkeeping against its plain model (tests/props/limiter_model.py).

hypothesis drives random sequences of generates (single and batch, two
clients, several TTLs), consumes, begins followed by a retryable failure,
revokes, double uses and time passing, on a real redis-server, through the
store (the combined admit+issue script and the release in consume, begin and
revoke). Every admit reply (admitted, or refused with its retry delay) must
equal the model's, and after every step the client's Redis record must hold
exactly the model's live buckets and counts: a used or revoked token stops
counting at once, an expired one when its bucket ends, and a token released
by a retryable failure is never taken out of its bucket twice. The record
stays small: a handful of fields, never one per token.

Time is the model's: the store gets ``clock_ms``, and "time passes" ages every
Redis key by the same amount (as tests/props/test_state_machine.py does), in
whole ticks of 60 s, so the real time an example takes never crosses a
boundary the model draws.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from tests.props.limiter_model import LimiterModel
from tests.props.profiles import props_settings
from tests.props.test_state_machine import _TIME_PASSES_LUA
from token_service.config import RateLimit
from token_service.errors import OutstandingCapReached, RateLimited, TokenInvalid, TokenUsed
from token_service.limits import IssuanceLimits, client_key, parse_limit_record
from token_service.records import IssueRequest, UseRequest
from token_service.store import TokenStore

TICK_MS = 60_000
BASE_NOW_MS = 1_800_000_000_000
SCOPE = "payment.create"
CLIENTS = {"a": client_key("ts:", "addr:198.51.100.1"), "b": client_key("ts:", "addr:198.51.100.2")}
TTLS = st.sampled_from([60, 120, 300, 900, 86400])


class LimiterMachine(RuleBasedStateMachine):
    client: Any = None
    examples = 0
    seen: ClassVar[Counter[str]] = Counter()

    tokens = Bundle("tokens")

    def __init__(self) -> None:
        super().__init__()
        type(self).examples += 1
        self.client.flushall()
        self.now_ms = BASE_NOW_MS
        self.store = TokenStore(self.client, clock_ms=lambda: self.now_ms)
        self.model = LimiterModel(0, 60_000, 0)
        self.limits = IssuanceLimits(None, 0)
        self.owner: dict[str, str] = {}
        self.time_passes = self.client.register_script(_TIME_PASSES_LUA)

    @initialize(
        rate=st.sampled_from([None, (3, 60), (10, 600), (1000, 1), (7, 60), (5000, 1)]),
        cap=st.sampled_from([0, 3, 5]),
    )
    def limits_of_this_example(self, rate: tuple[int, int] | None, cap: int) -> None:
        if rate is None and cap == 0:
            cap = 4
        limit, period = rate or (0, 60)
        self.model = LimiterModel(limit, period * 1000, cap)
        self.limits = IssuanceLimits(RateLimit(limit, period) if rate else None, cap)

    @rule(target=tokens, who=st.sampled_from(sorted(CLIENTS)), count=st.integers(1, 3), ttl=TTLS)
    def generate(self, who: str, count: int, ttl: int) -> list[str]:
        count = min(count, *(n for n in (self.model.limit, self.model.cap) if n))
        expected = self.model.admit(who, count, ttl, self.now_ms)
        request = IssueRequest(SCOPE, None, None, ttl)
        try:
            issued = self.store.admit_and_issue(CLIENTS[who], self.limits, request, count)
        except OutstandingCapReached as refused:
            got: tuple[object, ...] = ("too_many_outstanding", refused.retry_after_seconds)
            expected = (expected[0], max(1, -(-int(expected[1]) // 1000)))  # type: ignore[call-overload]
            issued = []
        except RateLimited as refused:
            got = ("rate_limited", refused.retry_after_seconds)
            expected = (expected[0], max(1, -(-int(expected[1]) // 1000)))  # type: ignore[call-overload]
            issued = []
        else:
            got = expected
            assert len(issued) == count
            for token in issued:
                self.model.issued(who, token, expected[1])  # type: ignore[arg-type]
                self.owner[token] = who
        assert got == expected
        self.seen[f"generate: {got[0]}"] += 1
        return issued

    def _use(self, what: str, tokens: list[str], call: Any) -> None:
        for token in tokens:
            try:
                call(token)
            except (TokenInvalid, TokenUsed) as error:
                self.seen[f"{what}: {error.code}"] += 1
            else:
                self.seen[f"{what}: ok"] += 1
            # whatever the outcome, the token counts no more: used now, or already
            # used, released or gone
            self.model.release(token)

    @rule(tokens=tokens)
    def consume(self, tokens: list[str]) -> None:
        self._use("consume", tokens, lambda token: self.store.consume(UseRequest(token, SCOPE)))

    @rule(tokens=tokens)
    def revoke(self, tokens: list[str]) -> None:
        self._use("revoke", tokens, self.store.revoke)

    @rule(tokens=tokens)
    def begin_then_fail_retryable(self, tokens: list[str]) -> None:
        def begin_and_release(token: str) -> None:
            started = self.store.begin(UseRequest(token, SCOPE), lease_seconds=3600)
            assert not isinstance(started, type(None))
            self.store.fail(token, started.lease_id, retryable=True)  # type: ignore[union-attr]

        self._use("begin+fail", tokens, begin_and_release)

    @rule(ticks=st.sampled_from([1, 2, 5, 15, 60]))
    def time_passes_by(self, ticks: int) -> None:
        delta = ticks * TICK_MS
        self.now_ms += delta
        keys = list(self.client.scan_iter(count=1000))
        if keys:
            self.time_passes(keys=keys, args=[delta])
        self.seen["time"] += 1

    @invariant()
    def the_records_hold_the_models_counts(self) -> None:
        for who, key in CLIENTS.items():
            raw = self.client.get(key)
            _, buckets = parse_limit_record(raw or b"")
            live = {end: n for end, n in buckets.items() if end * 1000 > self.now_ms}
            state = self.model.clients.get(who)
            assert live == (state.outstanding(self.now_ms) if state else {})
            assert all(n > 0 for n in buckets.values()), raw
            # a handful of buckets, never one per token
            assert len(buckets) <= 9 * 5
            if raw is not None:
                assert self.client.pttl(key) != -1  # never immortal


@pytest.mark.slow
@pytest.mark.real
def test_limiter_bookkeeping_follows_the_model(real_redis: Any) -> None:
    seen: ClassVar[Counter[str]] = Counter()
    machine = type("Machine", (LimiterMachine,), {"client": real_redis, "examples": 0, "seen": seen})
    profile = props_settings()
    # a third of the state machine's examples: the limiter has fewer states to cover
    run_state_machine_as_test(
        machine, settings=settings(profile, max_examples=max(50, profile.max_examples // 3))
    )
    print(f"limiter: {machine.examples} examples; {sorted(seen.items())}")
    if profile.derandomize:
        for outcome in (
            "generate: admitted",
            "generate: rate_limited",
            "generate: too_many_outstanding",
            "consume: ok",
            "consume: token_used",
            "consume: token_invalid",
            "revoke: ok",
            "begin+fail: ok",
        ):
            assert seen[outcome] > 0, f"never seen: {outcome}"
