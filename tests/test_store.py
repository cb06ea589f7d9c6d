"""The token state machine, straight on the store (fakeredis and real Redis)."""

from __future__ import annotations

import time
from typing import Any

import pytest

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
from token_service.scripts import lua_source
from token_service.store import TokenStore
from token_service.tokens import new_token, token_digest

SCOPE = "payment.create"


class Clock:
    """Milliseconds under the test's control, handed to the scripts as now_ms."""

    def __init__(self, start_ms: int = 1_800_000_000_000) -> None:
        self.now_ms = start_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, seconds: float) -> None:
        self.now_ms += int(seconds * 1000)


def issue(
    store: TokenStore, subject: str | None = "user-1", fingerprint: str | None = None, ttl: int = 60
) -> str:
    return store.issue(IssueRequest(SCOPE, subject, fingerprint, ttl))[0]


def test_issue_stores_only_a_digest(store: TokenStore, redis_client: Any) -> None:
    token = issue(store)
    keys = [key.decode() for key in redis_client.keys("*")]
    assert keys == [f"ts:t:{token_digest(token)}"]
    assert token not in keys[0]
    assert token.encode() not in redis_client.get(keys[0])
    assert 0 < redis_client.pttl(keys[0]) <= 60_000


def test_batch_issues_distinct_tokens(store: TokenStore, redis_client: Any) -> None:
    tokens = store.issue(IssueRequest(SCOPE, None, None, 60), count=250)
    assert len(set(tokens)) == 250
    assert redis_client.dbsize() == 250
    assert all(len(token) >= 43 for token in tokens)  # 256 bits, base64url


def test_consume_wins_once_and_replays_to_the_same_request_id(store: TokenStore) -> None:
    token = issue(store)
    assert store.consume(UseRequest(token, SCOPE, "user-1", request_id="req-1")) == records.Consumed(
        replayed=False
    )
    assert store.consume(UseRequest(token, SCOPE, "user-1", request_id="req-1")) == records.Consumed(
        replayed=True
    )
    with pytest.raises(TokenUsed):
        store.consume(UseRequest(token, SCOPE, "user-1", request_id="req-2"))
    with pytest.raises(TokenUsed):
        store.consume(UseRequest(token, SCOPE, "user-1"))
    assert store.inspect(token).state == "CONSUMED"


@pytest.mark.parametrize(
    ("scope", "subject", "fingerprint", "field"),
    [
        ("payment.refund", "user-1", "order-9", "scope"),
        (SCOPE, "user-2", "order-9", "subject"),
        (SCOPE, None, "order-9", "subject"),
        (SCOPE, "user-1", "order-8", "fingerprint"),
        (SCOPE, "user-1", None, "fingerprint"),
    ],
)
def test_mismatch_does_not_use_the_token(
    store: TokenStore, scope: str, subject: str | None, fingerprint: str | None, field: str
) -> None:
    token = issue(store, subject="user-1", fingerprint="order-9")
    with pytest.raises(TokenMismatch) as caught:
        store.consume(UseRequest(token, scope, subject, fingerprint))
    assert caught.value.field == field
    with pytest.raises(TokenMismatch):
        store.begin(UseRequest(token, scope, subject, fingerprint))
    assert store.inspect(token).state == "ISSUED"
    assert store.consume(UseRequest(token, SCOPE, "user-1", "order-9")).replayed is False


def test_unknown_revoked_and_expired_tokens_are_invalid(store: TokenStore, redis_client: Any) -> None:
    with pytest.raises(TokenInvalid):
        store.consume(UseRequest(new_token(), SCOPE))
    revoked = issue(store)
    store.revoke(revoked)
    with pytest.raises(TokenInvalid):
        store.consume(UseRequest(revoked, SCOPE, "user-1"))
    with pytest.raises(TokenInvalid):
        store.revoke(revoked)
    expired = issue(store)
    redis_client.pexpire(store.key(expired), 1)
    time.sleep(0.02)  # Redis (and fakeredis) expire the key on access after its TTL
    with pytest.raises(TokenInvalid):
        store.inspect(expired)


def test_two_phase_success_is_replayed_with_the_stored_result(store: TokenStore) -> None:
    token = issue(store)
    started = store.begin(UseRequest(token, SCOPE, "user-1", request_id="r1"), lease_seconds=30)
    assert isinstance(started, records.Started)
    assert store.inspect(token).state == "PROCESSING"
    with pytest.raises(TokenInProgress) as busy:
        store.begin(UseRequest(token, SCOPE, "user-1", request_id="r2"))
    assert 1 <= busy.value.retry_after_seconds <= 30
    # the begin's own retry gets its lease back rather than "in progress"
    again = store.begin(UseRequest(token, SCOPE, "user-1", request_id="r1"))
    assert again == records.Started(started.lease_id, started.lease_expires_ms, replayed=True)

    result = {"charge_id": "ch_1", "amount": 1250, "note": "ünïcode \u001f"}
    assert store.complete(token, started.lease_id, result) == records.Completed(replayed=False)
    assert store.complete(token, started.lease_id, {"other": 1}) == records.Completed(replayed=True)
    assert store.begin(UseRequest(token, SCOPE, "user-1")) == records.Finished(result=result)
    found = store.inspect(token)
    assert (found.state, found.result) == ("SUCCEEDED", result)
    assert found.record_ttl_ms > 86_000_000  # kept RESULT_TTL_SECONDS, past the token's 60 s
    with pytest.raises(TokenUsed):
        store.consume(UseRequest(token, SCOPE, "user-1"))


def test_retryable_failure_releases_and_terminal_failure_is_recorded(store: TokenStore) -> None:
    token = issue(store)
    first = store.begin(UseRequest(token, SCOPE, "user-1"))
    assert isinstance(first, records.Started)
    assert store.fail(token, first.lease_id, retryable=True) == records.FailRecorded("released", False)
    assert store.fail(token, first.lease_id, retryable=True) == records.FailRecorded("released", True)
    assert store.inspect(token).state == "ISSUED"

    second = store.begin(UseRequest(token, SCOPE, "user-1"))
    assert isinstance(second, records.Started)
    with pytest.raises(LeaseLost):
        store.complete(token, first.lease_id, "stale")
    error = {"reason": "card_declined"}
    assert store.fail(token, second.lease_id, retryable=False, error=error) == records.FailRecorded(
        "failed", False
    )
    with pytest.raises(TokenFailed) as failed:
        store.begin(UseRequest(token, SCOPE, "user-1"))
    assert failed.value.error == error
    with pytest.raises(TokenFailed):
        store.consume(UseRequest(token, SCOPE, "user-1"))
    assert store.inspect(token).error == error


def test_expired_lease_is_taken_over_and_the_old_lease_is_fenced(redis_client: Any) -> None:
    clock = Clock()
    store = TokenStore(redis_client, clock_ms=clock)
    token = issue(store, ttl=600)
    crashed = store.begin(UseRequest(token, SCOPE, "user-1", request_id="a"), lease_seconds=5)
    assert isinstance(crashed, records.Started)
    clock.advance(4)
    with pytest.raises(TokenInProgress):
        store.begin(UseRequest(token, SCOPE, "user-1", request_id="b"), lease_seconds=5)
    clock.advance(2)  # the holder crashed: its lease ran out
    assert store.inspect(token).state == "ISSUED"
    taker = store.begin(UseRequest(token, SCOPE, "user-1", request_id="b"), lease_seconds=5)
    assert isinstance(taker, records.Started)
    assert taker.lease_id != crashed.lease_id
    with pytest.raises(LeaseLost):
        store.complete(token, crashed.lease_id, {"late": True})
    with pytest.raises(LeaseLost):
        store.fail(token, crashed.lease_id, retryable=False)
    store.complete(token, taker.lease_id, {"ok": 1})
    assert store.inspect(token).result == {"ok": 1}


def test_an_expired_lease_cannot_complete_even_before_a_takeover(redis_client: Any) -> None:
    clock = Clock()
    store = TokenStore(redis_client, clock_ms=clock)
    token = issue(store, ttl=600)
    started = store.begin(UseRequest(token, SCOPE, "user-1"), lease_seconds=1)
    assert isinstance(started, records.Started)
    clock.advance(1.001)
    with pytest.raises(LeaseLost):
        store.complete(token, started.lease_id, 1)


def test_token_expiry_during_a_crashed_lease_makes_it_invalid(redis_client: Any) -> None:
    clock = Clock()
    store = TokenStore(redis_client, clock_ms=clock)
    token = issue(store, ttl=10)
    store.begin(UseRequest(token, SCOPE, "user-1"), lease_seconds=5)
    clock.advance(11)
    with pytest.raises(TokenInvalid):
        store.begin(UseRequest(token, SCOPE, "user-1"))
    with pytest.raises(TokenInvalid):
        store.consume(UseRequest(token, SCOPE, "user-1"))


def test_consume_after_an_expired_lease_wins(redis_client: Any) -> None:
    clock = Clock()
    store = TokenStore(redis_client, clock_ms=clock)
    token = issue(store, ttl=600)
    store.begin(UseRequest(token, SCOPE, "user-1"), lease_seconds=5)
    with pytest.raises(TokenInProgress):
        store.consume(UseRequest(token, SCOPE, "user-1"))
    clock.advance(6)
    assert store.consume(UseRequest(token, SCOPE, "user-1")).replayed is False


@pytest.mark.parametrize(
    ("script", "args", "message"),
    [
        ("issue", ["", "", "", "1000"], "scope is required"),
        ("issue", [SCOPE, "", "", "0"], "ttl_ms"),
        ("issue", [SCOPE, "", "", "abc"], "ttl_ms"),
        ("begin", [SCOPE, "user-1", "", "r", "-5", "lease", ""], "lease_ms"),
        ("begin", [SCOPE, "user-1", "", "r", "1000", "", ""], "lease_id"),
        ("complete", ["lease", "{}", "0", ""], "result_ttl_ms"),
        ("fail", ["lease", "maybe", "{}", "1000", ""], "retryable"),
        ("consume", [SCOPE], "expected 5 arguments"),
    ],
)
def test_scripts_validate_arguments_before_the_first_write(
    store: TokenStore, redis_client: Any, script: str, args: list[str], message: str
) -> None:
    token = issue(store)
    before = redis_client.get(store.key(token))
    reply = redis_client.eval(lua_source(script), 1, store.key(token), *args)
    assert reply[0] == b"invalid_argument"
    assert message in reply[1].decode()
    assert redis_client.get(store.key(token)) == before
    with pytest.raises(InvalidRequest):
        records.raise_for(reply)


def test_every_script_file_documents_its_contract() -> None:
    from token_service.scripts import SCRIPT_NAMES, lua_dir

    for name in SCRIPT_NAMES:
        head = (lua_dir() / f"{name}.lua").read_text().splitlines()[:6]
        assert any(line.startswith("-- KEYS[1]") for line in head), name
        assert any("returns" in line for line in (lua_dir() / f"{name}.lua").read_text().splitlines()[:12]), (
            name
        )
