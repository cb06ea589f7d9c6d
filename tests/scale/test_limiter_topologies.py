"""The outstanding cap on every topology: a used or revoked token frees its slot at once.

On standalone and Sentinel the release happens inside consume's, begin's and
revoke's own script (the client's record is in its KEYS); on Cluster the
client's record is in another slot, so the store releases it with a second
call (lua/release.lua). The async store (the SDK's direct transport) does the same.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tests.support.service import AUTH, service_config
from tests.support.topologies import Topology
from token_service import create_app
from token_service.connection import async_client_for, client_for
from token_service.limits import client_key
from token_service.records import UseRequest
from token_service.store import AsyncTokenStore, TokenStore

pytestmark = pytest.mark.real
SCOPE = "payment.create"
CAP = 3


@pytest.fixture(scope="module")
def capped_app(topology: Topology) -> Any:
    return create_app(service_config(topology.url, rate_limit="1000/second", max_outstanding_per_subject=CAP))


def fill(http: Any, addr: str) -> list[str]:
    filled = http.post(
        "/token/generate/batch",
        json={"scope": SCOPE, "count": CAP, "ttl_seconds": 86400},
        environ_base={"REMOTE_ADDR": addr},
    )
    assert filled.status_code == 201, filled.get_json()
    assert (
        http.post("/token/generate", json={"scope": SCOPE}, environ_base={"REMOTE_ADDR": addr}).status_code
        == 429
    )
    return [entry["token"] for entry in filled.get_json()["tokens"]]


@pytest.mark.parametrize("use", ["consume", "revoke", "begin"])
def test_a_used_token_frees_its_slot(capped_app: Any, use: str) -> None:
    http = capped_app.test_client()
    addr = f"192.0.2.{['consume', 'revoke', 'begin'].index(use) + 10}"
    tokens = fill(http, addr)
    body = {"token": tokens[0]} if use == "revoke" else {"token": tokens[0], "scope": SCOPE}
    assert http.post(f"/token/{use}", json=body, headers=AUTH).status_code == 200
    again = http.post("/token/generate", json={"scope": SCOPE}, environ_base={"REMOTE_ADDR": addr})
    assert again.status_code == 201
    assert (
        http.post("/token/generate", json={"scope": SCOPE}, environ_base={"REMOTE_ADDR": addr}).status_code
        == 429
    )


def test_the_async_store_releases_too(capped_app: Any, topology: Topology) -> None:
    http = capped_app.test_client()
    tokens = fill(http, "192.0.2.50")

    async def consume_and_revoke() -> None:
        client = async_client_for(topology.url, timeout_seconds=5)
        store = AsyncTokenStore(client)
        await store.consume(UseRequest(tokens[0], SCOPE))
        await store.revoke(tokens[1])
        await client.aclose()

    asyncio.run(consume_and_revoke())
    batch = http.post(
        "/token/generate/batch", json={"scope": SCOPE, "count": 2}, environ_base={"REMOTE_ADDR": "192.0.2.50"}
    )
    assert batch.status_code == 201
    assert client_key("ts:", "addr:192.0.2.50").endswith(tokens[0][43:])


def _total(name: str) -> float:
    return sum(
        sample.value for metric in REGISTRY.collect() for sample in metric.samples if sample.name == name
    )


def test_tokens_issued_under_limits_are_counted(capped_app: Any, topology: Topology) -> None:
    """On Cluster a limited generate is two store calls (admit, then issue): its tokens were not
    counted in token_service_tokens_issued (the metered store counted only its public issue)."""
    http = capped_app.test_client()
    issued, refused = _total("token_service_tokens_issued_total"), _total("token_service_rate_limited_total")
    fill(http, "192.0.2.60")  # CAP tokens, then one generate refused by the cap
    assert _total("token_service_tokens_issued_total") == issued + CAP
    assert _total("token_service_rate_limited_total") == refused + 1


@pytest.mark.parametrize("use", ["consume", "revoke", "begin"])
def test_a_used_token_leaves_the_anonymous_budget(topology: Topology, use: str) -> None:
    """The budget is one record for every client; on Cluster it shares the client records' slot,
    so admit names both, and the release after a consume is one more call in that slot."""
    # a key prefix per test: the budget is the deployment's, and these tests each fill it
    app = create_app(
        service_config(
            topology.url,
            key_prefix=f"b-{use}:",
            rate_limit="1000/second",
            anonymous_max_outstanding=str(CAP),
        )
    )
    http = app.test_client()
    tokens = [
        http.post("/token/generate", json={"scope": SCOPE}, environ_base={"REMOTE_ADDR": f"192.0.2.{70 + i}"})
        for i in range(CAP)
    ]
    assert [reply.status_code for reply in tokens] == [201] * CAP
    stranger = {"REMOTE_ADDR": "198.51.100.70"}
    refused = http.post("/token/generate", json={"scope": SCOPE}, environ_base=stranger)
    assert (refused.status_code, refused.get_json()["code"]) == (503, "issuance_paused")
    token = tokens[0].get_json()["token"]
    body = {"token": token} if use == "revoke" else {"token": token, "scope": SCOPE}
    assert http.post(f"/token/{use}", json=body, headers=AUTH).status_code == 200
    assert http.post("/token/generate", json={"scope": SCOPE}, environ_base=stranger).status_code == 201
    assert http.post("/token/generate", json={"scope": SCOPE}, environ_base=stranger).status_code == 503


def test_the_memory_reading_covers_every_primary(topology: Topology) -> None:
    client = client_for(topology.url, timeout_seconds=5)
    try:
        reading = TokenStore(client).memory_reading()
    finally:
        client.close()
    assert reading is not None
    nodes, counted = reading
    assert len(nodes) == (3 if topology.url.startswith("redis+cluster") else 1)
    assert all(used > 0 for used, _ in nodes)
    assert counted >= 0
