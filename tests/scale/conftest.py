"""Real topologies for the scale tests, shared per session (each costs seconds to start).

``topology`` is parametrized over standalone, Sentinel and Cluster; tests that
break a topology (kill, failover, migration) start their own instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.service import service_config
from tests.support.topologies import ClusterTopology, SentinelTopology, Standalone, Topology
from token_service import create_app


@pytest.fixture(scope="session")
def standalone_topology() -> Iterator[Standalone]:
    topology = Standalone().start()
    yield topology
    topology.stop()


@pytest.fixture(scope="session")
def cluster_topology() -> Iterator[ClusterTopology]:
    topology = ClusterTopology().start()
    yield topology
    topology.stop()


@pytest.fixture(scope="session")
def sentinel_topology() -> Iterator[SentinelTopology]:
    topology = SentinelTopology().start()
    yield topology
    topology.stop()


TOPOLOGIES = ["standalone", "sentinel", "cluster"]


@pytest.fixture(scope="session", params=[pytest.param(name, marks=pytest.mark.real) for name in TOPOLOGIES])
def topology(request: pytest.FixtureRequest) -> Topology:
    found: Topology = request.getfixturevalue(f"{request.param}_topology")
    return found


@pytest.fixture(scope="session")
def topology_app(topology: Topology) -> Any:
    return create_app(service_config(topology.url))


@pytest.fixture
def http(topology_app: Any) -> Any:
    return topology_app.test_client()
