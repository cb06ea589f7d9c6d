"""Upgrading loses nothing (issue 32, item 6): records written by the scripts of the release
before the lease-header layout (tests/upgrade/old_lua/, today's lua/ copied as it was) are
read by this release's code until they expire, on a real redis-server.

A token ISSUED before the upgrade is consumed once after it; an operation PROCESSING under
the old layout is fenced, renewed, completed or failed by its lease as before; a SUCCEEDED
or FAILED one replays its outcome to a retry and to the keyed path's plain claim alike.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.processes import RedisServer
from token_service import scripts
from token_service.client import TokenClient, idempotent
from token_service.client.keyed import operation_token
from token_service.errors import LeaseLost, TokenFailed, TokenInProgress, TokenUsed
from token_service.records import Finished, Started, UseRequest, read_record
from token_service.store import TokenStore

OLD_LUA = Path(__file__).parent / "old_lua"
SCOPE = "pay"

pytestmark = pytest.mark.real


def _old_source(name: str) -> str:
    """An old script as the old release linked it: all of old _record.lua, then the script."""
    return (OLD_LUA / "_record.lua").read_text() + "\n" + (OLD_LUA / f"{name}.lua").read_text()


class OldScripts:
    """The old release's begin/complete/fail/issue, run on the same Redis as the new store."""

    def __init__(self, client: redis.Redis, store: TokenStore) -> None:
        self.client = client
        self.store = store

    def run(self, name: str, key: str, *args: str) -> Any:
        return self.client.eval(_old_source(name), 1, key, *args)

    def issue(self, subject: str = "u1") -> str:
        token = "tok_" + __import__("secrets").token_urlsafe(32)
        assert self.run("issue", self.store.key(token), SCOPE, subject, "", "600000")[0] == b"issued"
        return token

    def begin(
        self, name: str, request_id: str, lease_id: str, claim_ms: str | None = None, scope: str = SCOPE
    ) -> None:
        args = [scope, "" if claim_ms else "u1", "", request_id, "30000", lease_id, ""]
        if claim_ms:
            args.append(claim_ms)
        assert self.run("begin", self.store.key(name), *args)[0] == b"started"

    def complete(self, name: str, lease_id: str, result: Any) -> None:
        reply = self.run("complete", self.store.key(name), lease_id, json.dumps(result), "600000", "")
        assert reply[0] == b"succeeded"


@pytest.fixture
def real(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def old(real: redis.Redis) -> OldScripts:
    return OldScripts(real, TokenStore(real))


def test_the_fixture_holds_the_old_scripts_not_these() -> None:
    # a copy that followed lua/ would test nothing
    assert (OLD_LUA / "complete.lua").read_text() != (scripts.lua_dir() / "complete.lua").read_text()
    assert "local function separator_in" in (OLD_LUA / "_record.lua").read_text()


def test_a_token_issued_before_is_consumed_once_after(old: OldScripts) -> None:
    token = old.issue()
    store = old.store
    assert store.consume(UseRequest(token, SCOPE, "u1", request_id="r1")).replayed is False
    assert store.consume(UseRequest(token, SCOPE, "u1", request_id="r1")).replayed is True
    with pytest.raises(TokenUsed):
        store.consume(UseRequest(token, SCOPE, "u1", request_id="r2"))


def test_an_old_processing_record_is_fenced_then_completed_by_its_lease(old: OldScripts) -> None:
    token = old.issue()
    old.begin(token, "r1", "L-old")
    store = old.store
    assert read_record(old.client.get(store.key(token)) or b"").lease_id == "L-old"
    with pytest.raises(TokenInProgress):
        store.begin(UseRequest(token, SCOPE, "u1", request_id="r2"))
    again = store.begin(UseRequest(token, SCOPE, "u1", request_id="r1"))  # its own lease back
    assert isinstance(again, Started)
    assert again.lease_id == "L-old"
    assert again.replayed
    with pytest.raises(LeaseLost):
        store.complete(token, "L-other", {"no": 1})
    assert store.renew(token, "L-old", 60).lease_seconds == pytest.approx(60, abs=1)
    assert store.complete(token, "L-old", {"paid": 1}).replayed is False
    assert store.complete(token, "L-old", {"paid": 2}).replayed is True  # the first result stands
    assert store.begin(UseRequest(token, SCOPE, "u1")) == Finished(result={"paid": 1})


def test_an_old_processing_record_fails_terminally_once(old: OldScripts) -> None:
    token = old.issue()
    old.begin(token, "r1", "L-old")
    store = old.store
    assert store.fail(token, "L-old", retryable=False, error={"declined": 1}).replayed is False
    assert store.fail(token, "L-old", retryable=False, error={"declined": 2}).replayed is True
    with pytest.raises(TokenFailed) as failed:
        store.begin(UseRequest(token, SCOPE, "u1"))
    assert failed.value.error == {"declined": 1}


def test_an_old_succeeded_token_replays_its_result(old: OldScripts) -> None:
    token = old.issue()
    old.begin(token, "r1", "L-old")
    old.complete(token, "L-old", {"order": 7})
    store = old.store
    assert store.begin(UseRequest(token, SCOPE, "u1")) == Finished(result={"order": 7})
    assert store.complete(token, "L-old", {"order": 8}).replayed is True
    with pytest.raises(TokenUsed):
        store.consume(UseRequest(token, SCOPE, "u1"))
    assert store.inspect(token).result == {"order": 7}


def test_keyed_operations_done_or_running_before_are_replayed_or_refused_after(
    old: OldScripts, redis_server: RedisServer
) -> None:
    done, running = operation_token("order.ship", "o-done"), operation_token("order.ship", "o-running")
    old.begin(done, "r-old", "L-done", claim_ms="600000", scope="order.ship")
    old.complete(done, "L-done", {"shipped": "o-done", "by": "the old release"})
    old.begin(running, "r-old", "L-run", claim_ms="600000", scope="order.ship")
    runs: list[str] = []
    sdk = TokenClient.from_redis(redis_server.url)

    @idempotent(sdk, "order.ship", key="order_id", renew=False)
    def ship(order_id: str) -> dict[str, str]:
        runs.append(order_id)
        return {"shipped": order_id, "by": "the new release"}

    try:
        assert ship("o-done") == {"shipped": "o-done", "by": "the old release"}
        with pytest.raises(TokenInProgress):
            ship("o-running")  # its old holder's lease is live: it is not run a second time
        assert ship("o-new") == {"shipped": "o-new", "by": "the new release"}
    finally:
        sdk.close()
    assert runs == ["o-new"]
