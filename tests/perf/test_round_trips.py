"""Round trips to Redis, counted: the costs the performance budgets rest on.

Counted with MONITOR on a real redis-server: every command a client sends is
one line; commands that a Lua script runs are marked ``lua`` and are part of
the one EVALSHA that ran them, so they are left out. These are correctness
tests of how many commands an operation sends, not timings.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis

from tests.support.processes import RedisServer
from tests.support.service import API_KEY, AUTH
from token_service import create_app, store
from token_service.client import TokenClient
from token_service.client.advanced import Finished
from token_service.limits import parse_budget_record, parse_limit_record
from token_service.records import IssueRequest, UseRequest
from token_service.store import TokenStore
from token_service.tokens import record_key

pytestmark = pytest.mark.real

SCOPE = "payment.create"


@contextmanager
def commands_sent(server: RedisServer) -> Iterator[list[str]]:
    """The commands clients sent while the block ran (script-internal ones left out)."""
    seen: list[str] = []
    watcher, marker_client = server.client(), server.client()
    marker_client.ping()  # connected (and its handshake done) before watching starts
    with watcher.monitor() as monitor:
        yield seen
        # MONITOR shows commands in the order Redis runs them: this one comes last.
        marker = f"end-of-block-{uuid.uuid4().hex}"
        marker_client.echo(marker)
        for event in monitor.listen():
            if marker in event["command"]:
                break
            if event["client_type"] != "lua":
                seen.append(event["command"])
    watcher.close()
    marker_client.close()


def command_names(commands: list[str]) -> list[str]:
    return [command.split(" ", 1)[0].strip('"').upper() for command in commands]


@pytest.fixture
def succeeded_token(real_redis: redis.Redis) -> str:
    token_store = TokenStore(real_redis)
    token = token_store.issue(IssueRequest(SCOPE, "user-1", None, 300))[0]
    started = token_store.begin(UseRequest(token, SCOPE, "user-1"))
    token_store.complete(token, started.lease_id, {"order": 42})  # type: ignore[union-attr]
    return token


def test_store_replay_of_a_succeeded_token_is_one_evalsha(
    redis_server: RedisServer, real_redis: redis.Redis, succeeded_token: str
) -> None:
    token_store = TokenStore(redis_server.client())
    token_store.begin(UseRequest(succeeded_token, SCOPE, "user-1"))  # warm: connection open, script cached
    with commands_sent(redis_server) as seen:
        outcome = token_store.begin(UseRequest(succeeded_token, SCOPE, "user-1"))
    assert outcome == Finished(result={"order": 42})
    assert command_names(seen) == ["EVALSHA"]


def test_sdk_direct_replay_of_a_succeeded_token_is_one_round_trip(
    redis_server: RedisServer, real_redis: redis.Redis, succeeded_token: str
) -> None:
    sdk = TokenClient.from_redis(redis_server.url)
    try:
        sdk.begin(succeeded_token, SCOPE, subject="user-1")  # warm
        with commands_sent(redis_server) as seen:
            outcome = sdk.begin(succeeded_token, SCOPE, subject="user-1")
    finally:
        sdk.close()
    assert isinstance(outcome, Finished)
    assert outcome.result == {"order": 42}
    assert command_names(seen) == ["EVALSHA"]


def test_http_replay_of_a_succeeded_token_is_one_evalsha(
    redis_server: RedisServer, real_redis: redis.Redis, succeeded_token: str
) -> None:
    app = create_app({"api_keys": API_KEY, "redis_url": redis_server.url})
    http = app.test_client()
    body = {"token": succeeded_token, "scope": SCOPE, "subject": "user-1"}
    assert http.post("/token/begin", json=body, headers=AUTH).status_code == 200  # warm
    with commands_sent(redis_server) as seen:
        reply = http.post("/token/begin", json=body, headers=AUTH)
    assert reply.status_code == 200
    assert reply.get_json() == {"outcome": "succeeded", "replayed": True, "result": {"order": 42}}
    assert command_names(seen) == ["EVALSHA"]


def test_first_call_after_a_script_flush_reloads_and_still_answers(
    redis_server: RedisServer, real_redis: redis.Redis, succeeded_token: str
) -> None:
    # The one-round-trip figure is the steady state; after a flush redis-py's
    # NOSCRIPT handling costs a SCRIPT LOAD once, and the answer is unchanged.
    token_store = TokenStore(redis_server.client())
    token_store.client.ping()  # connected before the count starts
    real_redis.script_flush()
    with commands_sent(redis_server) as seen:
        outcome = token_store.begin(UseRequest(succeeded_token, SCOPE, "user-1"))
    assert outcome == Finished(result={"order": 42})
    assert command_names(seen) == ["EVALSHA", "SCRIPT", "EVALSHA"]


def test_batch_issue_on_standalone_is_one_evalsha(redis_server: RedisServer, real_redis: redis.Redis) -> None:
    token_store = TokenStore(redis_server.client())
    token_store.issue(IssueRequest(SCOPE, None, None, 60), 2)  # warm
    with commands_sent(redis_server) as seen:
        tokens = token_store.issue(IssueRequest(SCOPE, "user-7", None, 60), 1000)
    assert len(set(tokens)) == 1000
    assert command_names(seen) == ["EVALSHA"]
    assert all(real_redis.get(token_store.key(token)) == b"Ipayment.create\x1fuser-7" for token in tokens)


def test_batch_issue_draws_again_for_a_digest_that_exists(
    real_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_store = TokenStore(real_redis)
    taken = token_store.issue(IssueRequest("other.scope", None, None, 60))[0]
    draws: Iterator[str] = iter([taken, "fresh-token-aaaaaaaaaaaaaaaa", "fresh-token-bbbbbbbbbbbbbbbb"])

    def new_tokens(count: int, suffix: str, key_prefix: str) -> tuple[list[str], list[str]]:
        drawn = [next(draws) + suffix for _ in range(count)]
        return drawn, [record_key(key_prefix, token) for token in drawn]

    monkeypatch.setattr(store, "new_tokens", new_tokens)

    tokens = token_store.issue(IssueRequest(SCOPE, None, None, 60), 2)

    assert sorted(tokens) == ["fresh-token-aaaaaaaaaaaaaaaa", "fresh-token-bbbbbbbbbbbbbbbb"]
    # the existing record was not overwritten
    assert real_redis.get(token_store.key(taken)) == b"Iother.scope"


async def test_async_batch_issue_is_one_evalsha(redis_server: RedisServer, real_redis: redis.Redis) -> None:
    import redis.asyncio

    client: Any = redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port)
    token_store = store.AsyncTokenStore(client)
    await token_store.issue(IssueRequest(SCOPE, None, None, 60), 2)  # warm
    with commands_sent(redis_server) as seen:
        tokens = await token_store.issue(IssueRequest(SCOPE, None, None, 60), 500)
    await client.aclose()
    assert len(set(tokens)) == 500
    assert command_names(seen) == ["EVALSHA"]


def test_generate_with_issuance_limits_on_is_one_evalsha(
    redis_server: RedisServer, real_redis: redis.Redis
) -> None:
    # the limiter is charged and the token issued in one script run (admit.lua + issue.lua)
    # (the memory reserve off: its reading, once a second, is a round trip of its own)
    app = create_app(
        {
            "api_keys": API_KEY,
            "redis_url": redis_server.url,
            "rate_limit": "100/minute",
            "anonymous_max_memory_percent": "0",
        }
    )
    http = app.test_client()
    assert http.post("/token/generate", json={"scope": SCOPE}).status_code == 201  # warm
    warm = http.post("/token/generate", json={"scope": SCOPE}).get_json()["token"]
    assert http.post("/token/consume", json={"token": warm, "scope": SCOPE}, headers=AUTH).status_code == 200
    with commands_sent(redis_server) as seen:
        reply = http.post("/token/generate", json={"scope": SCOPE, "subject": "user-3"})
    assert reply.status_code == 201
    assert command_names(seen) == ["EVALSHA"]
    token = reply.get_json()["token"]
    client_records = [key for key in real_redis.scan_iter("ts:{l}:*") if key != b"ts:{l}:anonymous"]
    assert len(client_records) == 1  # and the client was charged
    tat, buckets = parse_limit_record(real_redis.get(client_records[0]) or b"")
    assert tat is not None
    # the record remembers the buckets its token is counted in (field 6): the client's, the budget's
    record = real_redis.get(TokenStore(real_redis).key(token))
    assert record is not None
    counted_in = record.split(b"\x1f")[-1]
    assert record == b"Ipayment.create\x1fuser-3\x1f\x1f\x1f\x1f" + counted_in
    bucket, _, budget_part = counted_in.partition(b"/")
    assert buckets == {int(bucket): 2}
    assert parse_budget_record(real_redis.get("ts:{l}:anonymous")) == (2, 2 * int(budget_part.split(b"/")[1]))

    # consuming that token takes it out of its bucket in the same single EVALSHA
    consume = {"token": token, "scope": SCOPE, "subject": "user-3"}
    with commands_sent(redis_server) as seen:
        assert http.post("/token/consume", json=consume, headers=AUTH).status_code == 200
    assert command_names(seen) == ["EVALSHA"]
    assert parse_limit_record(real_redis.get(client_records[0]) or b"")[1] == {int(bucket): 1}
    assert parse_budget_record(real_redis.get("ts:{l}:anonymous"))[0] == 1


def test_a_refused_generate_issues_nothing(redis_server: RedisServer, real_redis: redis.Redis) -> None:
    app = create_app(
        {"api_keys": API_KEY, "redis_url": redis_server.url, "rate_limit": "2/hour"}
    )  # none refilled meanwhile
    http = app.test_client()
    statuses = [http.post("/token/generate", json={"scope": SCOPE}).status_code for _ in range(4)]
    assert statuses == [201, 201, 429, 429]
    assert len(list(real_redis.scan_iter("ts:t:*"))) == 2


def test_the_one_script_generate_checks_issue_arguments_as_issue_lua_does(real_redis: redis.Redis) -> None:
    from token_service.config import RateLimit
    from token_service.errors import InvalidRequest
    from token_service.limits import IssuanceLimits

    token_store = TokenStore(real_redis)
    limits = IssuanceLimits(RateLimit(100, 60), 10)
    # the Lua guard (the API's schema stops this earlier): a separator in a field
    with pytest.raises(InvalidRequest, match="separator"):
        token_store.admit_and_issue("ts:c:x", limits, IssueRequest(SCOPE, "a\x1fb", None, 60), 1)
    assert list(real_redis.scan_iter("ts:t:*")) == []
    tokens = token_store.admit_and_issue("ts:c:x", limits, IssueRequest(SCOPE, "user-1", None, 60), 3)
    assert len(tokens) == 3
    # counted in their client's bucket (field 6)
    records = [real_redis.get(token_store.key(t)) or b"" for t in tokens]
    assert {record.rsplit(b"\x1f", 1)[0] for record in records} == {b"Ipayment.create\x1fuser-1\x1f\x1f\x1f"}


def test_idempotent_first_execution_is_a_set_and_an_evalsha_and_its_replay_one_set(
    redis_server: RedisServer, real_redis: redis.Redis
) -> None:
    # issue 32: a keyed first claim is one plain SET NX GET PX (no script), its replay the same
    # one command (the SET finds the SUCCEEDED record and returns it untouched)
    from token_service.client import idempotent

    sdk = TokenClient.from_redis(redis_server.url)
    runs: list[str] = []

    @idempotent(sdk, "order.ship", key="order_id", renew=False)
    def ship(order_id: str) -> dict[str, str]:
        runs.append(order_id)
        return {"shipped": order_id}

    try:
        ship("o-warm")  # connection open, scripts cached
        with commands_sent(redis_server) as first:
            assert ship("o-1") == {"shipped": "o-1"}
        with commands_sent(redis_server) as replay:
            assert ship("o-1") == {"shipped": "o-1"}
    finally:
        sdk.close()
    assert runs == ["o-warm", "o-1"]
    assert command_names(first) == ["SET", "EVALSHA"]
    assert " NX GET PX " in first[0]
    assert command_names(replay) == ["SET"]
