"""The asyncio store (the SDK's direct transport) on every topology, built from a URL
with ``async_client_for``: batch issue across cluster masters, consume and replay,
and recovery after SCRIPT FLUSH."""

from __future__ import annotations

import pytest

from tests.support.topologies import ClusterTopology, SentinelTopology, Standalone, Topology
from token_service.connection import async_client_for
from token_service.errors import TokenUsed
from token_service.records import IssueRequest, UseRequest
from token_service.store import AsyncTokenStore

pytestmark = pytest.mark.real


def _flush_scripts(topology: Topology) -> None:
    if isinstance(topology, ClusterTopology):
        nodes = topology.nodes
    elif isinstance(topology, SentinelTopology):
        nodes = [topology.master]
    else:
        assert isinstance(topology, Standalone)
        nodes = [topology.server]
    for node in nodes:
        with node.client() as client:
            client.script_flush()


async def test_async_store_on_each_topology(topology: Topology) -> None:
    client = async_client_for(topology.url, timeout_seconds=2)
    store = AsyncTokenStore(client)
    try:
        request = IssueRequest("payment.create", "u1", None, 60)
        tokens = await store.issue(request, 40)
        _flush_scripts(topology)
        tokens += await store.issue(request, 40)  # NOSCRIPT inside the batch is recovered
        assert len(set(tokens)) == 80
        _flush_scripts(topology)
        for token in tokens:
            first = await store.consume(UseRequest(token, "payment.create", "u1", request_id="win"))
            assert first.replayed is False
            assert (
                await store.consume(UseRequest(token, "payment.create", "u1", request_id="win"))
            ).replayed is True
        with pytest.raises(TokenUsed):
            await store.consume(UseRequest(tokens[0], "payment.create", "u1", request_id="other"))
    finally:
        await client.aclose()
