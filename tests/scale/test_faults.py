"""Faults under load: resets, lost replies, kill -9 and restart, SCRIPT FLUSH,
a Sentinel failover and a Cluster slot migration.

Each scenario runs a background consume load (every token contended by two
callers with their own request ids; a caller retries a 503 with the same id)
while the fault happens, then heals it and checks what a payment system cares
about: no token won by two callers, no 500, 503 only while Redis could not
answer, and the same app instance recovers by itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.load import ConsumeLoad, Tally, flask_post
from tests.support.processes import RedisServer, wait_until
from tests.support.service import AUTH, service_config
from tests.support.tcp_proxy import FaultProxy, Mode
from tests.support.topologies import ClusterTopology, SentinelTopology, Standalone, Topology
from token_service import create_app
from token_service.tokens import record_key

pytestmark = [pytest.mark.real, pytest.mark.slow]

SCOPE = "payment.create"


def issue(app: Any, count: int, scope: str = SCOPE) -> list[str]:
    client = app.test_client()
    tokens: list[str] = []
    while len(tokens) < count:
        response = client.post(
            "/token/generate/batch", json={"scope": scope, "count": min(1000, count - len(tokens))}
        )
        assert response.status_code == 201, response.get_json()
        tokens += [item["token"] for item in response.get_json()["tokens"]]
    return tokens


def report(scenario: str, tally: Tally, **extra: Any) -> None:
    # figures for the issue note (visible with -s)
    print(f"\nFIGURES {scenario} {json.dumps({**tally.summary(), **extra})}")


def assert_safe(tally: Tally, tokens: list[str], *, unavailable_allowed: bool = True) -> None:
    assert not tally.double_wins, f"tokens won twice: {tally.double_wins}"
    assert tally.statuses[500] == 0, tally.summary()
    allowed = {200, 409, 503} if unavailable_allowed else {200, 409}
    assert set(tally.statuses) <= allowed, tally.summary()
    assert set(tally.codes) <= {"token_used", "store_unavailable"}, tally.summary()
    # callers retry 503s, so every token the load got to has exactly one winner
    finished = [token for token in tokens[: tally.tokens_done]]
    assert all(len(tally.winners[token]) == 1 for token in finished), tally.summary()


def assert_all_consumed(app: Any, tokens: list[str]) -> None:
    client = app.test_client()
    states = {
        client.post("/token/inspect", json={"token": t}, headers=AUTH).get_json()["state"] for t in tokens
    }
    assert states == {"CONSUMED"}


# -- through the fault proxy -----------------------------------------------------


@pytest.fixture
def proxied_app(standalone_topology: Standalone) -> Iterator[tuple[Any, FaultProxy]]:
    with FaultProxy(("127.0.0.1", standalone_topology.server.port)) as proxy:
        app = create_app(
            service_config(
                f"redis://127.0.0.1:{proxy.port}/0",
                redis_timeout_seconds="0.5",
            )
        )
        # scripts loaded, so a dropped EVALSHA reply is a consume Redis really ran (not a NOSCRIPT)
        assert app.test_client().get("/readyz").status_code == 200
        yield app, proxy


def test_lost_reply_turns_into_a_replayed_win_not_a_loss(proxied_app: tuple[Any, FaultProxy]) -> None:
    app, proxy = proxied_app
    client = app.test_client()
    token = issue(app, 1)[0]
    body = {"token": token, "scope": SCOPE, "request_id": "req-1"}
    # Redis runs the consume, the reply is lost, and so is the reply to redis-py's one retry
    proxy.drop_replies(2, match=b"EVALSHA")
    first = client.post("/token/consume", json=body, headers=AUTH)
    assert first.status_code == 503
    assert first.get_json()["code"] == "store_unavailable"
    assert "Retry-After" in first.headers
    assert proxy.stats.replies_dropped == 2
    # the caller retries with the same request id: the win it never heard of is its own
    retried = client.post("/token/consume", json=body, headers=AUTH)
    assert retried.status_code == 200
    assert retried.get_json() == {"outcome": "consumed", "replayed": True}
    other = client.post("/token/consume", json={**body, "request_id": "req-2"}, headers=AUTH)
    assert other.status_code == 409
    assert other.get_json()["code"] == "token_used"


def test_one_lost_reply_is_absorbed_by_the_client_retry(proxied_app: tuple[Any, FaultProxy]) -> None:
    app, proxy = proxied_app
    token = issue(app, 1)[0]
    proxy.drop_replies(1, match=b"EVALSHA", then="hang")  # the read times out instead
    response = app.test_client().post(
        "/token/consume", json={"token": token, "scope": SCOPE, "request_id": "r"}, headers=AUTH
    )
    assert response.status_code == 200
    assert response.get_json() == {"outcome": "consumed", "replayed": True}


def test_connection_resets_and_lost_replies_under_load(proxied_app: tuple[Any, FaultProxy]) -> None:
    app, proxy = proxied_app
    tokens = issue(app, 400)
    load = ConsumeLoad(flask_post(app, AUTH), tokens, scope=SCOPE).start()
    load.wait_for_tokens(30)
    for _ in range(5):
        proxy.reset_all()
        time.sleep(0.05)
    proxy.drop_replies(10, match=b"EVALSHA")  # lost replies mid-consume
    proxy.wait_for("replies_dropped", 10)
    with proxy.fault(Mode.RESET):  # Redis unreachable for a while: 503s
        time.sleep(0.4)
        # until the load saw it: on a loaded machine its threads may not run at all in 0.4 s
        wait_until(lambda: load.tally.statuses[503] > 0, what="a 503 while Redis is unreachable")
    healed = time.monotonic()
    recovery_seconds = load.wait_for_success_after(healed)
    load.wait_for_tokens(len(tokens))
    tally = load.stop()
    report("proxy_resets_and_lost_replies", tally, recovery_seconds=round(recovery_seconds, 3))
    assert_safe(tally, tokens)
    assert tally.statuses[503] > 0  # the outage was seen, and answered 503
    assert tally.replays > 0  # lost replies came back as replayed wins
    assert_all_consumed(app, tokens)


def test_blackholed_redis_answers_503_within_the_timeout(proxied_app: tuple[Any, FaultProxy]) -> None:
    app, proxy = proxied_app
    token = issue(app, 1)[0]
    client = app.test_client()
    with proxy.fault(Mode.BLACKHOLE):
        proxy.reset_all()  # pooled connections must not bypass the black hole
        started = time.monotonic()
        response = client.post("/token/consume", json={"token": token, "scope": SCOPE}, headers=AUTH)
        took = time.monotonic() - started
        assert response.status_code == 503
        assert client.get("/readyz").status_code == 503
    # 0.5 s socket timeout: fail closed, fast -- the bound is loose only so that a loaded
    # machine cannot trip it; a hang would take 30 s+
    assert took < 10
    assert (
        client.post("/token/consume", json={"token": token, "scope": SCOPE}, headers=AUTH).status_code == 200
    )


# -- process faults ----------------------------------------------------------------


def test_redis_killed_and_restarted_under_load() -> None:
    server = RedisServer("--appendonly", "yes", "--appendfsync", "always").start()
    try:
        app = create_app(service_config(server.url, redis_timeout_seconds="0.5"))
        tokens = issue(app, 400)
        load = ConsumeLoad(flask_post(app, AUTH), tokens, scope=SCOPE).start()
        load.wait_for_tokens(50)
        server.kill()  # kill -9, mid-load
        killed = time.monotonic()
        time.sleep(0.5)
        # until the load saw it: on a loaded machine its threads may not run at all in 0.5 s
        wait_until(lambda: load.tally.statuses[503] > 0, what="a 503 while Redis is down")
        server.start()  # same port, same dir: the AOF is replayed
        restarted = time.monotonic()
        recovery_seconds = load.wait_for_success_after(restarted)
        load.wait_for_tokens(len(tokens))
        tally = load.stop()
        report(
            "kill9_restart",
            tally,
            downtime_seconds=round(restarted - killed, 3),
            recovery_after_restart_seconds=round(recovery_seconds, 3),
        )
        assert_safe(tally, tokens)
        assert tally.statuses[503] > 0
        assert_all_consumed(app, tokens)
    finally:
        server.stop()


def _data_nodes(topology: Topology) -> list[RedisServer]:
    if isinstance(topology, ClusterTopology):
        return list(topology.nodes)
    if isinstance(topology, SentinelTopology):
        return [topology.master]
    assert isinstance(topology, Standalone)
    return [topology.server]


def test_script_flush_during_load(topology: Topology) -> None:
    app = create_app(service_config(topology.url))
    tokens = issue(app, 300)
    load = ConsumeLoad(flask_post(app, AUTH), tokens, scope=SCOPE).start()
    clients = [node.client() for node in _data_nodes(topology)]
    flushes = 0
    try:
        # Flush every node's scripts, then wait until the load has finished ten more tokens,
        # until it is through: each flush is followed by consumes that find no script loaded
        # (a condition, not a count of how often a loop ran: the machine's speed does not matter).
        while load.tally.tokens_done < len(tokens):
            for client in clients:
                client.script_flush()
            flushes += 1
            load.wait_for_tokens(min(load.tally.tokens_done + 10, len(tokens)), timeout_seconds=60)
    finally:
        for client in clients:
            client.close()
    tally = load.stop()
    report(f"script_flush[{topology.name}]", tally, flushes=flushes)
    assert_safe(tally, tokens, unavailable_allowed=False)  # NOSCRIPT is redis-py's job: not even a 503
    assert_all_consumed(app, tokens)


def test_sentinel_failover_during_load() -> None:
    topology = SentinelTopology().start(ready_to_fail_over=True)
    try:
        app = create_app(service_config(topology.url, redis_timeout_seconds="0.5"))
        tokens = issue(app, 600)
        with topology.master.client() as master:
            assert master.wait(1, 2000) == 1  # the replica has every token before the load starts
        load = ConsumeLoad(flask_post(app, AUTH), tokens, scope=SCOPE).start()
        load.wait_for_tokens(50)
        killed = time.monotonic()
        old_port, new_port = topology.kill_master()
        promoted = time.monotonic()
        recovery_seconds = load.wait_for_success_after(promoted)
        load.wait_for_tokens(len(tokens))
        tally = load.stop()
        unavailable = [at - killed for at in tally.unavailable_at if at >= killed]
        report(
            "sentinel_failover",
            tally,
            failover_seconds=round(promoted - killed, 3),
            first_success_after_promotion_seconds=round(recovery_seconds, 3),
            last_503_after_kill_seconds=round(max(unavailable), 3) if unavailable else None,
        )
        assert new_port != old_port
        assert_safe(tally, tokens)
        assert tally.statuses[503] > 0
        assert_all_consumed(app, tokens)
    finally:
        topology.stop()


def test_cluster_slot_migration_during_load(cluster_topology: ClusterTopology) -> None:
    # A hash-tagged prefix puts every token of this test in one slot: the slot
    # being migrated holds all the live tokens.
    prefix = "{mig}:"
    app = create_app(service_config(cluster_topology.url, key_prefix=prefix))
    tokens = issue(app, 400)
    slot = _slot(record_key(prefix, tokens[0]))
    source = cluster_topology.node_owning(record_key(prefix, tokens[0]))
    target = next(node for node in cluster_topology.nodes if node is not source)
    load = ConsumeLoad(flask_post(app, AUTH), tokens, scope=SCOPE).start()
    load.wait_for_tokens(40)
    started = time.monotonic()
    moved = cluster_topology.migrate_slot(slot, target, batch=20, pause_seconds=0.02)
    migration_seconds = time.monotonic() - started
    load.wait_for_tokens(len(tokens))
    tally = load.stop()
    report("cluster_slot_migration", tally, keys_moved=moved, migration_seconds=round(migration_seconds, 3))
    assert moved >= len(tokens) // 2  # the migration really overlapped the load
    assert cluster_topology.node_owning(record_key(prefix, tokens[0])) is target
    assert_safe(tally, tokens, unavailable_allowed=False)
    assert_all_consumed(app, tokens)


def _slot(key: str) -> int:
    from redis.cluster import key_slot

    return int(key_slot(key.encode()))


def test_cluster_master_killed_and_restarted_under_load() -> None:
    cluster = ClusterTopology(redis_args=("--appendonly", "yes", "--appendfsync", "always")).start()
    try:
        app = create_app(service_config(cluster.url, redis_timeout_seconds="0.5"))
        tokens = issue(app, 300)
        load = ConsumeLoad(flask_post(app, AUTH), tokens, scope=SCOPE).start()
        load.wait_for_tokens(30)
        victim = cluster.nodes[1]
        victim.kill()  # kill -9 one of three masters (no replicas): its slots have no owner
        killed = time.monotonic()
        time.sleep(1.5)
        # until the load saw it: on a loaded machine its threads may not reach the dead slots in 1.5 s
        wait_until(lambda: load.tally.statuses[503] > 0, what="a 503 while a master is down")
        victim.start()  # same port, dir and nodes.conf: it rejoins with its slots and its AOF
        cluster.wait_healthy()
        restarted = time.monotonic()
        recovery_seconds = load.wait_for_success_after(restarted)
        load.wait_for_tokens(len(tokens))
        tally = load.stop()
        report(
            "cluster_master_kill9_restart",
            tally,
            downtime_seconds=round(restarted - killed, 3),
            recovery_after_rejoin_seconds=round(recovery_seconds, 3),
        )
        assert_safe(tally, tokens)
        assert tally.statuses[503] > 0
        assert_all_consumed(app, tokens)
    finally:
        cluster.stop()


def test_whole_cluster_down_is_503_then_recovers() -> None:
    cluster = ClusterTopology(redis_args=("--appendonly", "yes", "--appendfsync", "always")).start()
    try:
        app = create_app(service_config(cluster.url, redis_timeout_seconds="0.3"))
        http = app.test_client()
        token = issue(app, 1)[0]
        for node in cluster.nodes:
            node.kill()
        body = {"token": token, "scope": SCOPE, "request_id": "caller"}
        # no node answers the slot-map refresh: redis-py's RedisClusterException is a 503 too
        down = http.post("/token/consume", json=body, headers=AUTH)
        assert down.status_code == 503
        assert down.get_json()["code"] == "store_unavailable"
        assert http.post("/token/generate", json={"scope": SCOPE}).status_code == 503
        assert http.get("/readyz").status_code == 503
        for node in cluster.nodes:
            node.start()
        cluster.wait_healthy()
        assert http.post("/token/consume", json=body, headers=AUTH).get_json() == {
            "outcome": "consumed",
            "replayed": False,
        }
        assert http.get("/readyz").status_code == 200
    finally:
        cluster.stop()
