"""The HTTP contract (openapi.yaml) on every topology: standalone, Sentinel and Cluster.

The app is built from a ``TOKEN_SERVICE_REDIS_URL`` of each kind
(``redis://``, ``redis+sentinel://``, ``redis+cluster://``), as an operator
would configure it. Batches spread their tokens over all cluster slots, so the
pipelined issue crosses every master.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.support.service import AUTH
from tests.support.topologies import ClusterTopology, Topology
from token_service.config import Settings
from token_service.connection import redis_client

pytestmark = pytest.mark.real


def generate(http: Any, **body: Any) -> dict[str, Any]:
    response = http.post("/token/generate", json={"scope": "payment.create", **body})
    assert response.status_code == 201, response.get_json()
    assert response.headers["Cache-Control"] == "no-store"
    return response.get_json()  # type: ignore[no-any-return]


def post(http: Any, path: str, **body: Any) -> Any:
    return http.post(path, json=body, headers=AUTH)


def test_the_url_selects_the_client_kind(topology: Topology) -> None:
    client = redis_client(Settings.from_mapping({"redis_url": topology.url}))
    expected = {"standalone": "Redis", "sentinel": "Redis", "cluster": "RedisCluster"}[topology.name]
    assert type(client).__name__ == expected
    if topology.name == "sentinel":
        assert type(client.connection_pool).__name__ == "SentinelConnectionPool"
    assert client.ping()
    client.close()


def test_consume_once_then_replay_then_used(http: Any) -> None:
    issued = generate(http, subject="u1", fingerprint="order-7")
    token, request_id = issued["token"], uuid.uuid4().hex
    body = {"token": token, "scope": "payment.create", "subject": "u1", "fingerprint": "order-7"}
    first = post(http, "/token/consume", **body, request_id=request_id)
    assert first.status_code == 200
    assert first.get_json() == {"outcome": "consumed", "replayed": False}
    again = post(http, "/token/consume", **body, request_id=request_id)
    assert again.get_json() == {"outcome": "consumed", "replayed": True}
    other = post(http, "/token/consume", **body, request_id=uuid.uuid4().hex)
    assert other.status_code == 409
    assert other.get_json()["code"] == "token_used"


def test_mismatch_does_not_use_up_the_token(http: Any) -> None:
    token = generate(http, subject="u1")["token"]
    wrong = post(http, "/token/consume", token=token, scope="payment.refund", subject="u1")
    assert wrong.status_code == 403
    assert wrong.get_json()["code"] == "token_mismatch"
    assert post(http, "/token/consume", token=token, scope="payment.create", subject="u1").status_code == 200


def test_unknown_and_revoked_tokens_are_invalid(http: Any) -> None:
    unknown = post(http, "/token/consume", token="A" * 43, scope="payment.create")
    assert unknown.status_code == 404
    assert unknown.get_json()["code"] == "token_invalid"
    token = generate(http)["token"]
    assert post(http, "/token/revoke", token=token).get_json() == {"outcome": "revoked"}
    assert post(http, "/token/inspect", token=token).status_code == 404


def test_two_phase_success_is_replayed(http: Any) -> None:
    token = generate(http)["token"]
    started = post(http, "/token/begin", token=token, scope="payment.create").get_json()
    assert started["outcome"] == "started"
    busy = post(http, "/token/begin", token=token, scope="payment.create")
    assert busy.status_code == 409
    assert busy.get_json()["code"] == "token_in_progress"
    assert "Retry-After" in busy.headers
    done = post(http, "/token/complete", token=token, lease_id=started["lease_id"], result={"charge": 42})
    assert done.get_json()["outcome"] == "succeeded"
    replay = post(http, "/token/begin", token=token, scope="payment.create").get_json()
    assert replay == {"outcome": "succeeded", "replayed": True, "result": {"charge": 42}}
    inspected = post(http, "/token/inspect", token=token).get_json()
    assert inspected["state"] == "SUCCEEDED"
    assert inspected["result"] == {"charge": 42}


def test_two_phase_failures(http: Any) -> None:
    token = generate(http)["token"]
    lease = post(http, "/token/begin", token=token, scope="payment.create").get_json()["lease_id"]
    released = post(http, "/token/fail", token=token, lease_id=lease, retryable=True)
    assert released.get_json()["outcome"] == "released"
    assert post(http, "/token/fail", token=token, lease_id=lease, retryable=False).status_code == 409
    lease = post(http, "/token/begin", token=token, scope="payment.create").get_json()["lease_id"]
    failed = post(
        http, "/token/fail", token=token, lease_id=lease, retryable=False, error={"why": "declined"}
    )
    assert failed.get_json()["outcome"] == "failed"
    refused = post(http, "/token/consume", token=token, scope="payment.create")
    assert refused.status_code == 409
    assert refused.get_json()["code"] == "token_failed"


def test_batch_spans_the_topology_and_every_token_works(http: Any, topology: Topology) -> None:
    response = http.post("/token/generate/batch", json={"scope": "cart.checkout", "count": 60})
    assert response.status_code == 201
    tokens = [item["token"] for item in response.get_json()["tokens"]]
    assert len(set(tokens)) == 60
    if isinstance(topology, ClusterTopology):
        prefix = "ts:"
        owners = {topology.node_owning(_record_key(prefix, token)).port for token in tokens}
        assert len(owners) == len(topology.nodes)  # the pipeline crossed every master
    for token in tokens:
        assert post(http, "/token/consume", token=token, scope="cart.checkout").status_code == 200


def _record_key(prefix: str, token: str) -> str:
    from token_service.tokens import record_key

    return record_key(prefix, token)


def test_scripts_come_back_after_script_flush(http: Any, topology: Topology) -> None:
    token = generate(http)["token"]
    _flush_scripts(topology)
    # single script calls reload on NOSCRIPT, the batch pipeline too, /readyz loads all
    assert post(http, "/token/consume", token=token, scope="payment.create").status_code == 200
    _flush_scripts(topology)
    batch = http.post("/token/generate/batch", json={"scope": "cart.checkout", "count": 30})
    assert batch.status_code == 201, batch.get_json()
    _flush_scripts(topology)
    assert http.get("/readyz").status_code == 200
    for node in _data_nodes(topology):
        with node.client() as client:
            assert client.script_exists(_consume_sha())[0], f"scripts missing on {node.port}"


def _consume_sha() -> str:
    import hashlib

    from token_service.scripts import lua_source

    return hashlib.sha1(lua_source("consume").encode()).hexdigest()  # noqa: S324 — Redis's script id


def _data_nodes(topology: Topology) -> list[Any]:
    if isinstance(topology, ClusterTopology):
        return list(topology.nodes)
    if topology.name == "sentinel":
        return [topology.master]  # type: ignore[attr-defined]
    return [topology.server]  # type: ignore[attr-defined]


def _flush_scripts(topology: Topology) -> None:
    for node in _data_nodes(topology):
        with node.client() as client:
            client.script_flush()


def test_readyz_and_healthz(http: Any) -> None:
    assert http.get("/healthz").status_code == 200
    assert http.get("/readyz").get_json() == {"status": "ready"}


def test_issuance_limit_on_each_topology(topology: Topology) -> None:
    from tests.support.service import service_config
    from token_service import create_app

    # a fresh key prefix: the limiter's counters of other tests do not count here
    app = create_app(
        service_config(topology.url, rate_limit="3/minute", key_prefix=f"lim{uuid.uuid4().hex[:8]}:")
    )
    http = app.test_client()
    statuses = [http.post("/token/generate", json={"scope": "payment.create"}).status_code for _ in range(3)]
    assert statuses == [201, 201, 201]
    _flush_scripts(topology)  # the limiter's script comes back too
    limited = http.post("/token/generate", json={"scope": "payment.create"})
    assert limited.status_code == 429
    assert limited.get_json()["code"] == "rate_limited"
    assert "Retry-After" in limited.headers
