"""Fixtures of the operators' tools tests: the admin over a real standalone Redis and a real Cluster."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.topologies import ClusterTopology, Standalone
from token_service.ops.admin import Admin
from token_service.store import TokenStore


@pytest.fixture(scope="session")
def ops_standalone() -> Iterator[Standalone]:
    topology = Standalone().start()
    yield topology
    topology.stop()


@pytest.fixture(scope="session")
def ops_cluster() -> Iterator[ClusterTopology]:
    topology = ClusterTopology().start()
    yield topology
    topology.stop()


@pytest.fixture(
    params=[
        pytest.param("standalone", marks=pytest.mark.real),
        pytest.param("cluster", marks=pytest.mark.real),
    ]
)
def redis_any(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A flushed client of a real standalone Redis, then of a real 3-master Cluster."""
    topology = request.getfixturevalue(f"ops_{request.param}")
    topology.flush()
    client = topology.client()
    yield client
    client.close()


@pytest.fixture
def store(redis_any: Any) -> TokenStore:
    return TokenStore(redis_any)


@pytest.fixture
def admin(redis_any: Any) -> Admin:
    return Admin(redis_any, actor="test")


@pytest.fixture
def audit_lines(caplog: pytest.LogCaptureFixture) -> Any:
    """A function returning the audit records logged so far in the test."""
    caplog.set_level(logging.INFO, logger="token_service.audit")
    return lambda: [record for record in caplog.records if record.name == "token_service.audit"]
