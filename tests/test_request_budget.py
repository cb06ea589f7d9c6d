"""The service's worst case per request is its Redis budget, derived from its settings.

``request_budget_seconds`` says how long a request may spend on Redis (one
``TOKEN_SERVICE_REDIS_TIMEOUT_SECONDS`` for the first attempt and one for each
of redis-py's retries); every Redis step of the request keeps to it. Against a
Redis stopped with SIGSTOP and behind a proxy that swallows everything, a
consume, a generate and ``/readyz`` answer 503 within it. Before, with
``REDIS_TIMEOUT=2``, a request on a connection idle past redis-py's health-check
interval (30 s, as after a quiet minute in production) took 6.1 s here, 8.15 s
under gunicorn: the health check's PING and its retry, then the command and its retry.
"""

from __future__ import annotations

import io
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.support.processes import RedisServer
from tests.support.service import API_KEY, AUTH
from tests.support.tcp_proxy import FaultProxy, Mode
from token_service import create_app
from token_service.config import Settings
from token_service.connection import request_budget_seconds

pytestmark = pytest.mark.real
SCOPE = "payment.create"
REDIS_TIMEOUT_SECONDS = 2.0
# What a loaded machine may add to the budget, far below what one more step would cost (2 s)
SLACK_SECONDS = 1.5


def test_the_budget_is_one_timeout_per_attempt() -> None:
    def budget(**values: Any) -> float:
        return request_budget_seconds(Settings.from_mapping(values))

    assert budget(redis_url="redis://h:6379/0", redis_timeout_seconds="2") == 4.0
    assert budget(redis_url="redis://h:6379/0", redis_timeout_seconds="5") == 10.0
    # a cluster client retries twice (after refreshing its slot map)
    assert budget(redis_url="redis+cluster://h:7000", redis_timeout_seconds="2") == 6.0


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own: it is stopped with SIGSTOP."""
    server = RedisServer().start()
    yield server
    assert server.process is not None
    server.process.send_signal(signal.SIGCONT)  # never left stopped, whatever the test did
    server.stop()


@pytest.fixture
def proxy(own_redis: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(("127.0.0.1", own_redis.port)) as proxy:
        yield proxy


def idle_past_health_checks(client: Any) -> None:
    """Every connection of the service's store as after 30 s without use: its next command
    is preceded by redis-py's health check (a PING, retried as commands are)."""
    store = client.application.extensions["token_service"]["store"]
    pool = store.client.connection_pool
    connections = [conn for _, conn in store._parked] + pool.idle_connections()
    assert connections, "the first request left a connection to reuse"
    for conn in connections:
        conn.next_health_check = -1.0


def service(url: str) -> tuple[Any, float]:
    settings = Settings.from_mapping(
        {
            "redis_url": url,
            "redis_timeout_seconds": str(REDIS_TIMEOUT_SECONDS),
            "api_keys": API_KEY,
            "rate_limit": "off",
            "max_outstanding_per_subject": "0",
        }
    )
    return create_app(settings).test_client(), request_budget_seconds(settings)


@contextmanager
def stopped(server: RedisServer) -> Iterator[None]:
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        server.process.send_signal(signal.SIGCONT)


def requests(client: Any, token: str) -> Iterator[tuple[str, Any]]:
    yield (
        "consume",
        lambda: client.post("/token/consume", json={"token": token, "scope": SCOPE}, headers=AUTH),
    )
    yield "generate", lambda: client.post("/token/generate", json={"scope": SCOPE})
    yield "readyz", lambda: client.get("/readyz")


def assert_each_503_within(client: Any, token: str, budget_seconds: float) -> None:
    for name, request in requests(client, token):
        idle_past_health_checks(client)
        started = time.monotonic()
        response = request()
        took = time.monotonic() - started
        assert response.status_code == 503, (name, response.data)
        if name != "readyz":
            assert response.json["code"] == "store_unavailable"
        assert took < budget_seconds + SLACK_SECONDS, (name, took)


def test_a_request_against_a_stopped_redis_answers_503_within_the_budget(own_redis: RedisServer) -> None:
    client, budget = service(own_redis.url)
    token = client.post("/token/generate", json={"scope": SCOPE}).json["token"]
    with stopped(own_redis):
        assert_each_503_within(client, token, budget)


def test_a_request_behind_a_black_hole_answers_503_within_the_budget(proxy: FaultProxy) -> None:
    client, budget = service(f"redis://127.0.0.1:{proxy.port}/0")
    token = client.post("/token/generate", json={"scope": SCOPE}).json["token"]
    proxy.set_mode(Mode.BLACKHOLE)
    assert_each_503_within(client, token, budget)
    proxy.set_mode(Mode.PASS)
    consumed = client.post("/token/consume", json={"token": token, "scope": SCOPE}, headers=AUTH)
    assert consumed.status_code == 200, consumed.data


def test_a_slow_body_does_not_spend_the_budget(own_redis: RedisServer) -> None:
    """The budget starts at the request's first Redis step, not when the request arrived."""
    client, budget = service(own_redis.url)

    class SlowBody(io.BytesIO):
        def read(self, size: int | None = -1) -> bytes:
            if not self.tell():
                time.sleep(budget + 0.5)  # longer than the whole budget, before Redis is asked
            return super().read(size)

    body = b'{"scope": "payment.create"}'
    response = client.post(
        "/token/generate",
        input_stream=SlowBody(body),
        headers={"Content-Type": "application/json", "Content-Length": str(len(body))},
    )
    assert response.status_code == 201, response.data
