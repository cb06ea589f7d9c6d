"""Shared fixtures: a Redis parametrized over fakeredis and a real redis-server.

``redis_client`` yields a flushed connection, once per backend, marked
``fake`` or ``real`` (select with ``-m fake`` / ``-m real``). ``app`` and
``client`` build the Flask app on it; ``store`` is the store alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis

from tests.support.processes import RedisServer
from tests.support.service import API_KEY
from tests.support.skip_summary import pytest_terminal_summary  # noqa: F401 — the run's last line
from token_service import create_app
from token_service.store import TokenStore


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``make test`` (pytest-xdist, ``--dist loadgroup``) a test file runs whole on one worker.

    Each test without an ``xdist_group`` mark gets its file as its group, so a file's module and
    session fixtures are set up once and its tests keep their order, as in a serial run; a mark
    names a group several files share (tests that must never run at the same time as each other).
    The slowest groups are sent out first, so the run is not left waiting on one started last.
    Runs before xdist's own hook, which reads the marks (``tryfirst`` below).
    """
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
    items.sort(key=lambda item: _SLOW_FIRST.get(_group(item), len(_SLOW_FIRST)))


def _group(item: pytest.Item) -> str:
    mark = item.get_closest_marker("xdist_group")
    assert mark is not None
    return str(mark.args[0] if mark.args else mark.kwargs["name"])


# The groups that take longest (`pytest --durations`, docs/testing.md), slowest first; the rest
# follow in collection order (sort is stable).
_SLOW_FIRST: dict[str, int] = {name: rank for rank, name in enumerate([])}


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(
    params=[pytest.param("fake", marks=pytest.mark.fake), pytest.param("real", marks=pytest.mark.real)]
)
def redis_client(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "fake":
        client: Any = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        client = server.client()
    client.flushall()
    yield client
    client.flushall()
    client.close()


@pytest.fixture
def real_redis(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    client.flushall()
    yield client
    client.flushall()
    client.close()


@pytest.fixture
def store(redis_client: Any) -> TokenStore:
    return TokenStore(redis_client)


@pytest.fixture
def app_config(redis_client: Any) -> dict[str, Any]:
    # No issuance limits here: tests/edge/ covers them; the rest exercise the token logic.
    return {
        "api_keys": API_KEY,
        "redis_client": redis_client,
        "rate_limit": "off",
        "max_outstanding_per_subject": 0,
    }


@pytest.fixture
def app(app_config: dict[str, Any]) -> Any:
    return create_app(app_config)


@pytest.fixture
def client(app: Any) -> Any:
    return app.test_client()
