"""complete.lua's fast path for a plain keyed claim (store.py's SET NX GET PX, then complete):
the stored record is compared whole with the claim this store wrote and replaced by the
SUCCEEDED record built in Python. These hold that path to the same outcomes as the usual one
and to the same fencing, against a real redis-server."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from token_service import records
from token_service.errors import InvalidRequest, LeaseLost
from token_service.records import Finished, Started, UseRequest
from token_service.scripts import lua_source
from token_service.store import TokenStore

pytestmark = pytest.mark.real

SCOPE = "bench.order"


def claim(store: TokenStore, name: str = "op-1", fingerprint: str | None = "fp") -> Started:
    started = store.begin(UseRequest(name, SCOPE, None, fingerprint), 30, 600)
    assert isinstance(started, Started)
    return started


def complete_script(client: redis.Redis, key: str, args: list[str]) -> Any:
    return client.register_script(lua_source("complete"))(keys=[key], args=args)


def test_a_keyed_complete_stores_what_the_usual_path_stores(real_redis: redis.Redis) -> None:
    fast, usual = TokenStore(real_redis), TokenStore(real_redis)
    leases = [claim(fast, "op-fast").lease_id, claim(usual, "op-usual").lease_id]
    usual._claims.clear()  # this store forgot its claim: complete.lua's usual path
    assert fast.complete("op-fast", leases[0], {"n": 1}) == records.Completed(replayed=False)
    assert usual.complete("op-usual", leases[1], {"n": 1}) == records.Completed(replayed=False)
    stored = [records.read_record(real_redis.get(fast.key(name)) or b"") for name in ("op-fast", "op-usual")]
    assert [r.state for r in stored] == ["S", "S"]
    assert stored[0].payload == stored[1].payload == '{"n":1}'
    assert (stored[0].scope, stored[0].fingerprint, stored[0].lease_id) == (SCOPE, "fp", leases[0])
    assert 0 < real_redis.pttl(fast.key("op-fast")) <= fast.result_ttl_seconds * 1000
    assert fast._claims == {}  # nothing kept after the complete
    replay = fast.begin(UseRequest("op-fast", SCOPE, None, "fp"), 30, 600)
    assert replay == Finished(result={"n": 1})


def test_the_fast_path_sends_the_result_once_and_replies_a_bare_zero(real_redis: redis.Redis) -> None:
    store = TokenStore(real_redis)
    lease = claim(store).lease_id
    claimed = store._claims[lease]
    assert real_redis.get(store.key("op-1")) == claimed.encode()
    args = records.complete_args(lease, {"n": 1}, 60, "", claimed)
    assert len(args) == 3  # the result only inside the SUCCEEDED record, no now_ms
    assert complete_script(real_redis, store.key("op-1"), args) == 0
    assert real_redis.get(store.key("op-1")) == args[1].encode()
    # a retry of the same complete (its reply lost): the first result stands, the record unchanged
    assert complete_script(real_redis, store.key("op-1"), args) == [b"succeeded", 1]
    assert real_redis.get(store.key("op-1")) == args[1].encode()


def test_a_stale_holder_is_fenced_out(real_redis: redis.Redis) -> None:
    store = TokenStore(real_redis)
    stale = claim(store).lease_id
    # its lease (the key's expiry) ran out, and another caller claimed the operation
    real_redis.delete(store.key("op-1"))
    other = claim(TokenStore(real_redis)).lease_id
    taken = real_redis.get(store.key("op-1"))
    with pytest.raises(LeaseLost):
        store.complete("op-1", stale, {"n": "stale"})
    assert real_redis.get(store.key("op-1")) == taken
    assert records.read_record(taken or b"").lease_id == other
    real_redis.delete(store.key("op-1"))  # and once its key is gone too
    assert complete_script(real_redis, store.key("op-1"), records.complete_args(stale, 1, 60, "", "P")) == [
        b"token_invalid"
    ]
    assert real_redis.exists(store.key("op-1")) == 0


@pytest.mark.parametrize("state", ["S", "F"])
def test_a_finished_record_is_not_rewritten(real_redis: redis.Redis, state: str) -> None:
    store = TokenStore(real_redis)
    lease = claim(store).lease_id
    key = store.key("op-1")
    finished = f"{state}\x1e{lease}\x1f\x1f\x1freq\x1f{SCOPE}\x1f\x1ffp\x1f{{}}"
    real_redis.set(key, finished)
    reply = complete_script(
        real_redis, key, records.complete_args(lease, {"n": 2}, 60, "", store._claims[lease])
    )
    assert reply == ([b"succeeded", 1] if state == "S" else [b"lease_lost"])
    assert real_redis.get(key) == finished.encode()


def test_a_token_lease_is_never_finished_by_the_keyed_path(real_redis: redis.Redis) -> None:
    # a token's PROCESSING record carries its lease's end, which only the usual path checks:
    # the keyed path takes only a claim without one, and otherwise writes nothing
    key = "ts:t:some-token"
    ran_out = f"P\x1eL1\x1f1000\x1f9999999999999\x1freq\x1f{SCOPE}\x1f\x1f"
    real_redis.set(key, ran_out, px=60_000)
    reply = complete_script(real_redis, key, records.complete_args("L1", {"n": 3}, 60, "", ran_out))
    assert reply == [b"lease_lost"]
    assert real_redis.get(key) == ran_out.encode()


def test_a_bad_keep_time_writes_nothing(real_redis: redis.Redis) -> None:
    store = TokenStore(real_redis)
    lease = claim(store).lease_id
    key = store.key("op-1")
    claimed = store._claims[lease]
    args = records.complete_args(lease, {"n": 1}, 60, "", claimed)
    args[2] = "0"  # past the codec's check, straight to the script
    with pytest.raises(redis.ResponseError):
        complete_script(real_redis, key, args)
    assert real_redis.get(key) == claimed.encode()
    with pytest.raises(InvalidRequest):
        records.complete_args(lease, {"n": 1}, 0, "", claimed)


def test_a_full_memo_only_loses_the_shortcut(
    real_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("token_service.store._MAX_CLAIMS", 2)
    store = TokenStore(real_redis)
    leases = [claim(store, f"op-{i}").lease_id for i in range(3)]
    assert list(store._claims) == [leases[2]]  # the third emptied it
    for i, lease in enumerate(leases):
        assert store.complete(f"op-{i}", lease, i) == records.Completed(replayed=False)
        assert records.read_record(real_redis.get(store.key(f"op-{i}")) or b"").payload == str(i)


def test_a_result_dumped_once_is_stored_as_dumped(real_redis: redis.Redis) -> None:
    # the direct transport checks the result (records.check_payload dumps it) and can hand that
    # JSON on, instead of the store dumping the result a second time
    store = TokenStore(real_redis)
    lease = claim(store).lease_id
    dumped = records.check_payload("result", {"n": [1, 2]}, 1000)
    assert store.complete("op-1", lease, dumped).replayed is False
    assert records.read_record(real_redis.get(store.key("op-1")) or b"").payload == '{"n":[1,2]}'
