"""The store against the reference model of the token state table (tests/props/model.py).

hypothesis drives random sequences of generate (single and pipelined batch),
consume (with and without request ids, right and wrong scope/subject/
fingerprint), request-id replays of won consumes, begin, complete, fail
(retryable and not), renew, revoke, inspect, unknown tokens and time passing. Every
reply must equal the model's prediction, and some invariants are checked from
the store's replies alone, independently of the model:

- never two winners: per token at most one non-replayed consume win, complete
  or terminal fail;
- a request-id replay of a won consume reports ``replayed`` (or, once the token
  expired or was revoked, ``token_invalid``), never a loss;
- a mismatch never uses up the token: the raw Redis record is byte-for-byte the
  same after it;
- a stale lease (superseded, released, run out, or the token was consumed or
  revoked) never completes, fails or renews a token, and a renewal never
  shortens a lease;
- stored results and errors come back exactly (begin, consume, inspect);
- inspect changes nothing (raw record unchanged);
- every record carries an expiry (no immortal key).

Time. The store gets ``clock_ms`` = the model's clock, so leases run on a
controlled clock. Redis's key TTLs run in real time, so "time passes" also
moves Redis's clock by hand: every record's PTTL is reduced by the same amount
(deleted when it reaches zero). Token expiry is therefore modelled too, and an
example never waits. All durations are whole multiples of ``TICK_MS`` (one
minute), so the real time an example takes (milliseconds; the slowest one is
printed) can never move a record across a boundary the model draws, and Redis
never expires a record on its own during an example. (With a 5 s tick, one
run on a starved 2-core machine had an inspect see 111 ms left where the model
expected 15 s, and hypothesis could not replay it: most likely real time had
crossed a tick.)
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from tests.props.model import TokenModel
from tests.props.profiles import props_settings
from token_service import records
from token_service.errors import (
    InvalidRequest,
    LeaseLost,
    TokenFailed,
    TokenInProgress,
    TokenInvalid,
    TokenMismatch,
    TokenUsed,
)
from token_service.records import IssueRequest, UseRequest
from token_service.store import TokenStore

TICK_MS = 60_000  # every model duration is whole ticks; an example runs for well under one
SEP = "\x1f"
BASE_NOW_MS = 1_800_000_000_000
RESULT_TTL_MS = 3 * TICK_MS

SCOPES = st.sampled_from(["payment.create", "order:submit"])
SUBJECTS = st.sampled_from([None, "alice", "bob"])
FINGERPRINTS = st.sampled_from([None, "fp-1", "fp-2"])
REQUEST_IDS = st.sampled_from([None, "req-a", "req-b", "req-c"])
# keyed operations' records (client/keyed.py): names no generate ever issues
KEYED_NAMES = st.sampled_from(["op:order-1", "op:order-2"])
# None: present the token's own binding; a tuple: present that (often a mismatch)
# (three times in four the token's own, which shrinks best)
BINDINGS = st.tuples(st.integers(0, 3), st.tuples(SCOPES, SUBJECTS, FINGERPRINTS)).map(
    lambda choice: choice[1] if choice[0] == 3 else None
)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    # any text, control characters included: \x1f is the record's field separator
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
)

RARE_ACTIONS = [
    "revoke",
    "unknown lease: complete",
    "unknown lease: fail",
    "unknown token: consume",
    "unknown token: begin",
    "unknown token: inspect",
    "unknown token: revoke",
    "separator: consume",
    "separator: begin",
    "separator: renew",
]

Binding = tuple[str, str | None, str | None]
Lease = tuple[str, str, str | None, Binding]  # token, lease id, the begin's request id and binding

# Test-only: age every given key by ARGV[1] ms in one round trip; returns how
# many keys had no expiry at all (which no token record may have).
_TIME_PASSES_LUA = """
local immortal = 0
for _, key in ipairs(KEYS) do
  local pttl = redis.call('PTTL', key)
  if pttl == -1 then
    immortal = immortal + 1
  elseif pttl > 0 then
    if pttl <= tonumber(ARGV[1]) then redis.call('DEL', key)
    else redis.call('PEXPIRE', key, pttl - tonumber(ARGV[1])) end
  end
end
return immortal
"""


def outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    """The store's reply or error, in the model's outcome shape."""
    try:
        reply = call()
    except TokenInvalid:
        return ("token_invalid",)
    except TokenMismatch as exc:
        return ("token_mismatch", exc.field)
    except TokenUsed:
        return ("token_used",)
    except TokenInProgress as exc:
        return ("token_in_progress", exc.retry_after_seconds)
    except TokenFailed as exc:
        return ("token_failed", exc.error)
    except LeaseLost:
        return ("lease_lost",)
    except InvalidRequest:
        return ("invalid_request",)
    if isinstance(reply, records.Consumed):
        return ("consumed", reply.replayed)
    if isinstance(reply, records.Started):
        return ("started", reply.replayed, reply.lease_id, reply.lease_expires_ms)
    if isinstance(reply, records.Finished):
        return ("succeeded", reply.result)
    if isinstance(reply, records.Renewed):
        return ("renewed", reply.lease_expires_ms)
    if isinstance(reply, records.Completed):
        return ("succeeded", reply.replayed)
    if isinstance(reply, records.FailRecorded):
        return (reply.outcome, reply.replayed)
    if isinstance(reply, records.Inspection):
        return (
            reply.state,
            reply.scope,
            reply.subject,
            reply.fingerprint,
            reply.lease_expires_ms,
            reply.result,
            reply.error,
        )
    if reply is None:  # revoke
        return ("revoked",)
    raise AssertionError(f"unexpected reply {reply!r}")


class TokenStateMachine(RuleBasedStateMachine):
    client: Any = None  # the Redis connection, set by the test
    examples = 0
    slowest_seconds = 0.0  # the longest example in real time: must stay far below a tick
    seen: Counter[tuple[str, Any]]  # (rule, outcome kind) over the whole run, set by the test

    tokens = Bundle("tokens")
    leases = Bundle("leases")
    wins = Bundle("wins")

    def __init__(self) -> None:
        super().__init__()
        type(self).examples += 1
        self.started = time.monotonic()
        self.model = TokenModel(BASE_NOW_MS, RESULT_TTL_MS)
        self.store = TokenStore(
            self.client,
            key_prefix=f"props:{uuid.uuid4().hex[:12]}:",
            result_ttl_seconds=RESULT_TTL_MS // 1000,
            clock_ms=lambda: self.model.now_ms,
        )
        self.bindings: dict[str, Binding] = {}
        # Derived from the store's replies only, for the model-free invariants:
        self.wins_per_token: Counter[str] = Counter()
        self.live_lease: dict[str, str | None] = {}  # token -> the lease the store last granted
        self.lease_expires: dict[str, int] = {}  # lease -> its expiry as the store reported it

    def teardown(self) -> None:
        type(self).slowest_seconds = max(self.slowest_seconds, time.monotonic() - self.started)
        self.seen[("time", "expired")] += self.model.expirations
        keys = [self.store.key(token) for token in self.bindings]
        if keys:
            self.client.delete(*keys)

    # -- helpers ---------------------------------------------------------------------
    def _raw(self, token: str) -> tuple[Any, int]:
        key = self.store.key(token)
        pipe = self.client.pipeline(transaction=False)
        pipe.get(key)
        pipe.pttl(key)
        value, pttl = pipe.execute()
        return value, pttl

    def _note(self, rule_name: str, actual: tuple[Any, ...]) -> None:
        kind = (
            actual[:2]
            if actual[0] in ("consumed", "started", "succeeded", "released", "failed")
            else actual[0]
        )
        if rule_name == "begin" and actual[0] == "succeeded":
            kind = "succeeded"
        self.seen[(rule_name, kind)] += 1

    def _binding(self, token: str, binding: Binding | None) -> Binding:
        return binding if binding is not None else self.bindings[token]

    def _stale(self, token: str, lease_id: str) -> bool:
        return self.live_lease.get(token) != lease_id or self.lease_expires[lease_id] <= self.model.now_ms

    def _assert_unchanged(self, token: str, before: tuple[Any, int]) -> None:
        value, pttl = self._raw(token)
        assert value == before[0], "the record changed"
        assert pttl <= before[1], "the record's expiry was extended"

    # -- rules -----------------------------------------------------------------------
    @rule(
        target=tokens,
        scope=SCOPES,
        subject=SUBJECTS,
        fingerprint=FINGERPRINTS,
        ttl_ticks=st.integers(1, 8),
        count=st.integers(1, 2),
    )
    def generate(
        self, scope: str, subject: str | None, fingerprint: str | None, ttl_ticks: int, count: int
    ) -> Any:
        ttl_ms = ttl_ticks * TICK_MS
        issued = self.store.issue(IssueRequest(scope, subject, fingerprint, ttl_ms // 1000), count)
        assert len(set(issued)) == count
        for token in issued:
            assert token not in self.bindings
            self.bindings[token] = (scope, subject, fingerprint)
            self.model.generate(token, scope, subject, fingerprint, ttl_ms)
        return multiple(*issued)

    @rule(target=wins, token=tokens, binding=BINDINGS, request_id=REQUEST_IDS)
    def consume(self, token: str, binding: Binding | None, request_id: str | None) -> Any:
        won = self._consume("consume", token, self._binding(token, binding), request_id)
        return multiple(won) if won and request_id is not None else multiple()

    @rule(lease=leases)
    def duplicate_consume(self, lease: Lease) -> None:
        """A one-shot consume of a token that went through begin (in progress, done, failed...)."""
        token, _, _, binding = lease
        self._consume("consume", token, binding, None)

    def _consume(
        self, rule_name: str, token: str, binding: Binding, request_id: str | None
    ) -> tuple[str, Binding, str | None] | None:
        scope, subject, fingerprint = binding
        before = self._raw(token)
        expected = self.model.consume(token, scope, subject, fingerprint, request_id)
        actual = outcome(
            lambda: self.store.consume(UseRequest(token, scope, subject, fingerprint, request_id))
        )
        assert actual == expected
        self._note(rule_name, actual)
        if actual[0] == "token_mismatch":
            self._assert_unchanged(token, before)
        if actual != ("consumed", False):
            return None
        self.wins_per_token[token] += 1
        self.live_lease[token] = None
        return (token, binding, request_id)

    @rule(win=wins)
    def replay_consume(self, win: tuple[str, Binding, str]) -> None:
        token, (scope, subject, fingerprint), request_id = win
        expected = self.model.consume(token, scope, subject, fingerprint, request_id)
        actual = outcome(
            lambda: self.store.consume(UseRequest(token, scope, subject, fingerprint, request_id))
        )
        assert actual == expected
        self._note("replay_consume", actual)
        # a won consume retried is a win again, unless the token is gone (expired, revoked)
        assert actual in (("consumed", True), ("token_invalid",))

    @rule(
        target=leases,
        token=tokens,
        binding=BINDINGS,
        request_id=REQUEST_IDS,
        lease_ticks=st.integers(1, 4),
    )
    def begin(self, token: str, binding: Binding | None, request_id: str | None, lease_ticks: int) -> Any:
        return self._begin(token, self._binding(token, binding), request_id, lease_ticks)

    @rule(target=leases, lease=leases, lease_ticks=st.integers(1, 4))
    def retry_begin(self, lease: Lease, lease_ticks: int) -> Any:
        """A begin sent again with its request id (its reply was lost): the same lease while live."""
        token, _, request_id, binding = lease
        return self._begin(token, binding, request_id, lease_ticks)

    @rule(
        target=leases,
        name=KEYED_NAMES,
        scope=SCOPES,
        fingerprint=FINGERPRINTS,
        request_id=REQUEST_IDS,
        lease_ticks=st.integers(1, 4),
        claim_ticks=st.integers(1, 4),
    )
    def begin_keyed(
        self,
        name: str,
        scope: str,
        fingerprint: str | None,
        request_id: str | None,
        lease_ticks: int,
        claim_ticks: int,
    ) -> Any:
        """A keyed operation's begin (no token issued, no subject): an absent record is claimed."""
        self.bindings.setdefault(name, (scope, None, fingerprint))  # aged by time_passes like tokens
        claim_ms = claim_ticks * TICK_MS
        if self.model.live(name) is None:
            # absent (or expired): claimed afresh, a new operation with nothing won yet
            self.model.generate(name, scope, None, fingerprint, claim_ms)
            self.wins_per_token[name] = 0
            self.live_lease[name] = None

        def call(lease_seconds: int) -> Any:
            claim_seconds = claim_ms // 1000
            return self.store.begin(
                UseRequest(name, scope, None, fingerprint, request_id or ""), lease_seconds, claim_seconds
            )

        return self._begin(name, (scope, None, fingerprint), request_id, lease_ticks, call)

    def _begin(
        self,
        token: str,
        binding: Binding,
        request_id: str | None,
        lease_ticks: int,
        keyed: Callable[[int], Any] | None = None,
    ) -> Any:
        scope, subject, fingerprint = binding
        lease_ms = lease_ticks * TICK_MS
        before = self._raw(token)
        expected = self.model.begin(token, scope, subject, fingerprint, request_id, lease_ms)
        actual = outcome(
            (lambda: keyed(lease_ms // 1000))
            if keyed
            else (
                lambda: self.store.begin(
                    UseRequest(token, scope, subject, fingerprint, request_id), lease_ms // 1000
                )
            )
        )
        if expected[0] == "started" and expected[2] is None:
            # a new lease: its id is the store's to choose, but it must be fresh
            assert actual[0] == "started", f"expected a new lease, got {actual}"
            lease_id = actual[2]
            assert lease_id not in self.lease_expires
            assert actual == ("started", False, lease_id, expected[3])
            self.model.started(token, request_id, lease_id, lease_ms)
            self.live_lease[token] = lease_id
            self.lease_expires[lease_id] = actual[3]
            self._note("begin", actual)
            return multiple((token, lease_id, request_id, binding))
        assert actual == expected
        self._note("begin", actual)
        if actual[0] == "token_mismatch":
            self._assert_unchanged(token, before)
        return multiple()

    @rule(lease=leases, lease_ticks=st.integers(1, 4))
    def renew(self, lease: Lease, lease_ticks: int) -> None:
        token, lease_id, _, _ = lease
        stale = self._stale(token, lease_id)
        before = self._raw(token)
        expected = self.model.renew(token, lease_id, lease_ticks * TICK_MS)
        actual = outcome(lambda: self.store.renew(token, lease_id, lease_ticks * TICK_MS // 1000))
        assert actual == expected
        self._note("renew", actual)
        if actual[0] == "renewed":
            assert not stale, "a stale lease was renewed"
            assert actual[1] >= self.lease_expires[lease_id], "a renewal shortened the lease"
            self.lease_expires[lease_id] = actual[1]
        else:
            self._assert_unchanged(token, before)

    @rule(lease=leases, result=JSON_VALUES, lost_reply=st.booleans())
    def complete(self, lease: Lease, result: Any, lost_reply: bool) -> None:
        token, lease_id, _, _ = lease
        stale = self._stale(token, lease_id)
        expected = self.model.complete(token, lease_id, result)
        actual = outcome(lambda: self.store.complete(token, lease_id, result))
        assert actual == expected
        self._note("complete", actual)
        if actual == ("succeeded", False):
            assert not stale, "a stale lease completed the token"
            self.wins_per_token[token] += 1
            self.live_lease[token] = None
            self._inspect(token)  # read the stored result back
            if lost_reply:  # the holder retries: the first result stands, flagged replayed
                retried = outcome(lambda: self.store.complete(token, lease_id, "a different result"))
                assert retried == self.model.complete(token, lease_id, "a different result")
                assert retried == ("succeeded", True)
                self._note("complete", retried)

    @rule(lease=leases, retryable=st.booleans(), error=JSON_VALUES, lost_reply=st.booleans())
    def fail(self, lease: Lease, retryable: bool, error: Any, lost_reply: bool) -> None:
        token, lease_id, _, _ = lease
        stale = self._stale(token, lease_id)
        expected = self.model.fail(token, lease_id, retryable, error)
        actual = outcome(lambda: self.store.fail(token, lease_id, retryable=retryable, error=error))
        assert actual == expected
        self._note("fail", actual)
        if actual in (("failed", False), ("released", False)):
            assert not stale, "a stale lease failed the token"
            self.live_lease[token] = None
        if actual == ("failed", False):
            self.wins_per_token[token] += 1
            self._inspect(token)  # read the stored error back
        if lost_reply and actual in (("failed", False), ("released", False)):
            retried = outcome(lambda: self.store.fail(token, lease_id, retryable=retryable, error="other"))
            assert retried == self.model.fail(token, lease_id, retryable, "other")
            if actual == ("failed", False):
                assert retried == ("failed", True)
            self._note("fail", retried)

    @rule(token=tokens)
    def inspect(self, token: str) -> None:
        self._inspect(token)

    def _inspect(self, token: str) -> None:
        before = self._raw(token)
        expected = self.model.inspect(token)
        found: list[records.Inspection] = []
        actual = outcome(lambda: found.append(self.store.inspect(token)) or found[0])
        assert actual == expected
        self._note("inspect", actual)
        if found:
            t = self.model.live(token)
            assert t is not None
            want_ms = self.model.record_ttl_ms(t)
            # Redis's real clock ran a little since the record was written: never more than a tick
            assert want_ms - TICK_MS < found[0].record_ttl_ms <= want_ms
        self._assert_unchanged(token, before)

    @rule(
        token=tokens,
        action=st.sampled_from(RARE_ACTIONS),
    )
    def rarely(self, token: str, action: str) -> None:
        """Revoke, present a lease or token the store never issued, or a value holding the
        record's field separator (one rule, so each of these stays rare)."""
        if action == "revoke":
            expected = self.model.revoke(token)
            actual = outcome(lambda: self.store.revoke(token))
            assert actual == expected
            self._note("revoke", actual)
            self.live_lease[token] = None
            assert self._raw(token)[0] is None
        elif action.startswith("separator"):
            # \x1f separates the record's fields: refused before any write, whatever the state
            scope, subject, fingerprint = self.bindings[token]
            request_id = "req" + SEP + "x"
            before = self._raw(token)
            if action.endswith("consume"):
                actual = outcome(
                    lambda: self.store.consume(UseRequest(token, scope, subject, fingerprint, request_id))
                )
            elif action.endswith("renew"):
                actual = outcome(lambda: self.store.renew(token, request_id, 60))
            else:
                actual = outcome(
                    lambda: self.store.begin(UseRequest(token, scope, subject, fingerprint, request_id))
                )
            assert actual == ("invalid_request",)
            self._note("rarely", actual)
            self._assert_unchanged(token, before)
        elif action.startswith("unknown lease"):
            lease_id = "not-a-lease-" + uuid.uuid4().hex[:8]
            before = self._raw(token)
            if action.endswith("complete"):
                expected = self.model.complete(token, lease_id, "x")
                actual = outcome(lambda: self.store.complete(token, lease_id, "x"))
            else:
                expected = self.model.fail(token, lease_id, True, None)
                actual = outcome(lambda: self.store.fail(token, lease_id, retryable=True))
            assert actual == expected
            assert actual in (("lease_lost",), ("token_invalid",))
            self._assert_unchanged(token, before)
        else:
            stranger = "never-issued-" + uuid.uuid4().hex
            calls: dict[str, Callable[[], Any]] = {
                "consume": lambda: self.store.consume(UseRequest(stranger, "payment.create")),
                "begin": lambda: self.store.begin(UseRequest(stranger, "payment.create")),
                "inspect": lambda: self.store.inspect(stranger),
                "revoke": lambda: self.store.revoke(stranger),
            }
            assert outcome(calls[action.rsplit(" ", 1)[1]]) == ("token_invalid",)
            assert self._raw(stranger) == (None, -2)

    @rule(ticks=st.integers(1, 2))
    def time_passes(self, ticks: int) -> None:
        elapsed_ms = ticks * TICK_MS
        self.model.advance(elapsed_ms)
        # move Redis's clock too: every record's remaining life shrinks by the same amount
        keys = [self.store.key(token) for token in self.bindings]
        immortal = self.client.eval(_TIME_PASSES_LUA, len(keys), *keys, elapsed_ms)
        assert immortal == 0, "a token record without an expiry"

    # -- invariants ------------------------------------------------------------------
    @invariant()
    def never_two_winners(self) -> None:
        assert all(count <= 1 for count in self.wins_per_token.values()), self.wins_per_token


# Outcomes the run must have produced at least once, or it proved little.
MUST_SEE = {
    ("consume", ("consumed", False)),
    ("consume", "token_mismatch"),
    ("consume", "token_used"),
    ("consume", "token_in_progress"),
    ("consume", "token_failed"),
    ("consume", "token_invalid"),
    ("replay_consume", ("consumed", True)),
    ("begin", ("started", False)),
    ("begin", ("started", True)),
    ("begin", "succeeded"),
    ("begin", "token_in_progress"),
    ("begin", "token_mismatch"),
    ("renew", "renewed"),
    ("renew", "lease_lost"),
    ("complete", ("succeeded", False)),
    ("complete", ("succeeded", True)),
    ("complete", "lease_lost"),
    ("fail", ("released", False)),
    ("fail", ("released", True)),
    ("fail", ("failed", False)),
    ("fail", ("failed", True)),
    ("fail", "lease_lost"),
    ("inspect", "ISSUED"),
    ("inspect", "PROCESSING"),
    ("inspect", "CONSUMED"),
    ("inspect", "SUCCEEDED"),
    ("inspect", "FAILED"),
    ("inspect", "token_invalid"),
    ("revoke", "revoked"),
    ("rarely", "invalid_request"),
    ("time", "expired"),
}


@pytest.mark.slow
def test_store_follows_the_spec_state_table(redis_client: Any) -> None:
    seen: Counter[tuple[str, Any]] = Counter()
    machine = type(
        "StoreMachine",
        (TokenStateMachine,),
        {"client": redis_client, "examples": 0, "slowest_seconds": 0.0, "seen": seen},
    )
    profile = props_settings()
    run_state_machine_as_test(machine, settings=profile)
    # the figures for the issue note (shown with -s)
    print(
        f"state machine: {machine.examples} examples, {sum(seen.values())} checked operations, "
        f"slowest example {machine.slowest_seconds:.2f} s"
    )
    print(sorted(seen.items(), key=str))
    assert machine.examples >= profile.max_examples
    if profile.derandomize:  # a random run (quick, explore) may miss a corner by chance
        assert set(seen) >= MUST_SEE, f"never seen: {MUST_SEE - set(seen)}"
