"""Shared fixtures: a Redis parametrized over fakeredis and a real redis-server.

``redis_client`` yields a flushed connection, once per backend, marked
``fake`` or ``real`` (select with ``-m fake`` / ``-m real``). ``app`` and
``client`` build the Flask app on it; ``store`` is the store alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis

from tests.support.processes import RedisServer
from tests.support.service import API_KEY, NO_BUDGET
from tests.support.skip_summary import pytest_terminal_summary  # noqa: F401 — the run's last line
from token_service import create_app, tokens
from token_service import store as store_module
from token_service.store import TokenStore


def pytest_configure(config: pytest.Config) -> None:
    # xdist hands out groups biggest (in tests) first unless told not to; _SLOW_FIRST's order is
    # measured in seconds, which is what a worker left waiting at the end costs
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if config.getvalue("loadgroup") if hasattr(config.option, "loadgroup") else False:
        config.pluginmanager.register(_GroupInNodeId(), "xdist-group-in-node-id")


class _GroupInNodeId:
    """``--dist loadgroup`` on pytest 9: put each test's group into its node id, as xdist means to.

    xdist's worker appends ``@group`` by assigning ``item._nodeid``; pytest 9 reads the node id
    from ``item._id`` (a structured NodeId), so the suffix was lost and the scheduler spread every
    test on its own, groups ignored (pytest-dev/pytest-xdist#1386, its fix #1388 unreleased):
    a file's module fixtures were set up on several workers, the "leases" files ran side by side,
    and the fuzzing's coverage check never saw its cases. Runs after xdist's hook; a node id that
    already carries its group (an xdist with the fix) is left alone.
    """

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        from _pytest.nodeid import NodeId

        for item in items:
            suffix = "@" + _group(item)
            if not item.nodeid.endswith(suffix):
                item._id = NodeId.parse(item.nodeid + suffix)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``make test`` (pytest-xdist, ``--dist loadgroup``) a test file runs whole on one worker.

    Each test without an ``xdist_group`` mark gets its file as its group, so a file's module and
    session fixtures are set up once and its tests keep their order, as in a serial run; a mark
    names a group several files share (tests that must never run at the same time as each other).
    The files of ``_LEASES`` share the group "leases". The slowest groups are sent out first, so
    the run is not left waiting on one started last. Runs before xdist's own hook, which reads
    the marks (``tryfirst``).
    """
    _unique_node_ids(items)
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            path = item.nodeid.split("::", 1)[0]
            item.add_marker(pytest.mark.xdist_group("leases" if path in _LEASES else path))
    items.sort(key=lambda item: _SLOW_FIRST.get(_group(item), len(_SLOW_FIRST)))


def _unique_node_ids(items: list[pytest.Item]) -> None:
    """Every test has a node id of its own, or the run stops before it starts.

    schemathesis (4.x, on pytest 9) names each operation's test ``test_api[POST /token/consume]``
    but gives all of them the function's node id. A serial run does not mind; pytest-xdist sends
    tests to its workers by node id, so it ran one of the 20 operations and the fuzzing's own
    coverage check skipped as "only part ran". Such items get the id their name says.
    """
    for item in items:
        if item.parent is not None and not item.nodeid.endswith("::" + item.name):
            item._id = item.parent.id.child(item.name)
    counts = Counter(item.nodeid for item in items)
    repeated = sorted(nodeid for nodeid, count in counts.items() if count > 1)
    if repeated:
        raise pytest.UsageError(f"tests share a node id (pytest-xdist runs one of them): {repeated}")


def _group(item: pytest.Item) -> str:
    mark = item.get_closest_marker("xdist_group")
    assert mark is not None
    return str(mark.args[0] if mark.args else mark.kwargs["name"])


# Tests whose outcome depends on a lease being renewed, or a deadline being met, within about
# two seconds of wall time while they run: a duplicate sent past the first lease must still find
# it held, a slow client must still be cut off by the server's deadline and no sooner. Each one
# waits for conditions, but two of them side by side on a loaded machine compete for the same
# scarce CPU at the moments that matter, so they run one after another on one worker ("leases").
# Tests that only sleep past a lease no one renews (test_lease_expiry.py), drive a fake clock
# (test_renew.py) or wait 20 s for a 0.3 s body under a 60 s lease (client/test_guard_race.py)
# are not here: a slow machine cannot change their outcome. scale/test_faults.py is: it bounds
# how long recovering from a fault may take.
_LEASES = frozenset(
    [
        "tests/client/test_outcome_blips.py",
        "tests/integrations/test_celery_outcome.py",
        "tests/integrations/test_require_token_outcome.py",
        "tests/client/test_idempotency_outcome.py",
        "tests/client/test_renewal.py",
        "tests/client/test_renewal_asgi.py",
        "tests/client/test_renewal_decorators.py",
        "tests/client/test_renewal_gunicorn.py",
        "tests/client/test_renewal_scheduler.py",
        "tests/integrations/test_django_renewal.py",
        "tests/integrations/test_fastapi_renewal.py",
        "tests/client/test_clock_skew.py",
        "tests/durable/test_claim_clock_skew.py",
        "tests/edge/test_slow_clients.py",
        "tests/edge/test_slow_readers.py",
        "tests/scale/test_faults.py",
    ]
)

# The groups that take longest, slowest first: their tests' setup + call + teardown added up
# (--junitxml) in a clean-clone make test on 3 workers at load 10-18, 522 s for "leases" down to
# 50 s; the rest follow in collection order (sort is stable). A group missing here only starts
# later; a name that no longer exists costs nothing.
_SLOW_FIRST: dict[str, int] = {
    name: rank
    for rank, name in enumerate(
        [
            "leases",
            "tests/integrations/test_django.py",
            "tests/frontend/test_checkout_e2e.py",
            "tests/client/test_asgi_uvicorn.py",
            "tests/integrations/test_django_response_kinds.py",
            "tests/model/test_lease_model.py",
            "tests/test_shipped.py",
            # ~130 s on a fresh machine (npm ci, the generator's virtualenv), ~90 s after
            "tests/contract/test_generated_clients.py",
            "tests/integrations/test_celery.py",
            "tests/ops/test_admin_cli.py",
            "tests/integrations/test_docs.py",
            "tests/props/test_state_machine.py",
            "floors[db]",
            "tests/client/test_response_kinds_gunicorn.py",
            "tests/perf/test_harness.py",
            "tests/scale/test_race.py",
            "floors[server-client-telemetry]",
            "tests/ops/test_large_scan.py",
            "tests/edge/test_sdk_connection_reuse.py",
            "tests/frontend/test_helper_route_and_shop.py",
            "tests/edge/test_embedded_store_one_worker.py",
            "floors[asgi-fastapi]",
            "floors[django]",
            "floors[celery]",
            "tests/client/test_idempotency_gunicorn.py",
            "tests/ops/test_admin_api.py",
            "tests/frontend/test_package.py",
            "tests/edge/test_gunicorn_floor.py",
            "tests/edge/test_metric_files.py",
            "tests/edge/test_gunicorn.py",
            "tests/integrations/test_fastapi.py",
            "tests/concurrency/test_http_race.py",
        ]
    )
}


@pytest.fixture
def digests(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every token_digest computed, wherever it is called from."""
    seen: list[str] = []
    real = tokens.token_digest

    def counting(token: str) -> str:
        seen.append(token)
        return real(token)

    monkeypatch.setattr(tokens, "token_digest", counting)
    monkeypatch.setattr(store_module, "token_digest", counting)
    return seen


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
    # No issuance limits here (nor the anonymous budget): tests/edge/ covers them; the rest
    # exercise the token logic.
    return {
        "api_keys": API_KEY,
        "redis_client": redis_client,
        "rate_limit": "off",
        "max_outstanding_per_subject": 0,
        **NO_BUDGET,
    }


@pytest.fixture
def app(app_config: dict[str, Any]) -> Any:
    return create_app(app_config)


@pytest.fixture
def client(app: Any) -> Any:
    return app.test_client()
