"""Connections to Redis are bounded, and those left idle are closed.

1,000 concurrent requests during an 8 s stall of Redis took it from 2 to 513
clients, still 513 afterwards: every caller that found no free connection
opened one (up to 2,048 per worker) and none was ever closed. Now a service
worker opens at most ``TOKEN_SERVICE_REDIS_MAX_CONNECTIONS`` (a caller beyond
them waits for one within its Redis budget, then answers 503), and a
connection unused for ``TOKEN_SERVICE_REDIS_IDLE_SECONDS`` is closed; the SDK's
``from_redis(max_connections=...)`` the same. Counted by Redis itself
(``CLIENT LIST``) on a real redis-server stopped with SIGSTOP.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tests.support.processes import RedisServer, wait_until
from tests.support.service import API_KEY, AUTH
from token_service import create_app
from token_service.client import TokenClient

pytestmark = pytest.mark.real
SCOPE = "payment.create"
BOUND = 6
CALLERS = 40
IDLE_SECONDS = 1.0
STALL_SECONDS = 2.5


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own: it is stopped with SIGSTOP."""
    server = RedisServer().start()
    yield server
    assert server.process is not None
    server.process.send_signal(signal.SIGCONT)  # never left stopped, whatever the test did
    server.stop()


def clients_of_others(observer: redis.Redis) -> int:
    """Connections Redis has open, but the observer's own."""
    return len(observer.client_list()) - 1


def during_a_stall(server: RedisServer, calls: list[Callable[[], Any]]) -> list[Any]:
    """Each call in a thread of its own, all started while Redis is stopped; what each returned
    or raised, once Redis went on and every call ended."""
    outcomes: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            outcomes[i] = calls[i]()
        except Exception as exc:  # what the call raised is its outcome
            outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)
    try:
        for thread in threads:
            thread.start()
        time.sleep(STALL_SECONDS)
    finally:
        server.process.send_signal(signal.SIGCONT)
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive(), "a call hung"
    return outcomes


def test_the_services_connections_stay_within_the_bound_and_idle_ones_close(own_redis: RedisServer) -> None:
    app = create_app(
        {
            "redis_url": own_redis.url,
            "api_keys": API_KEY,
            "rate_limit": "off",
            "max_outstanding_per_subject": "0",
            "redis_max_connections": str(BOUND),
            "redis_idle_seconds": str(IDLE_SECONDS),
        }
    )
    tokens = [
        app.test_client().post("/token/generate", json={"scope": SCOPE}).json["token"] for _ in range(CALLERS)
    ]

    def consume(token: str) -> Callable[[], int]:
        body = {"token": token, "scope": SCOPE}
        return lambda: app.test_client().post("/token/consume", json=body, headers=AUTH).status_code

    statuses = during_a_stall(own_redis, [consume(token) for token in tokens])
    assert set(statuses) <= {200, 503}, statuses  # each answered: consumed, or Redis did not answer in time
    with own_redis.client() as observer:
        assert clients_of_others(observer) <= BOUND
        wait_until(
            lambda: clients_of_others(observer) == 0, what="idle connections closed", timeout_seconds=20
        )


def test_the_sdks_connections_stay_within_the_bound_and_idle_ones_close(own_redis: RedisServer) -> None:
    # a budget longer than the stall: every call gets its turn at a connection, and succeeds
    with TokenClient.from_redis(own_redis.url, timeout=8, max_connections=BOUND) as client:
        tokens = [issued.token for issued in client.generate_batch(SCOPE, CALLERS)]
        outcomes = during_a_stall(
            own_redis, [lambda token=token: client.consume(token, SCOPE) for token in tokens]
        )
        assert [getattr(outcome, "replayed", outcome) for outcome in outcomes] == [False] * CALLERS
        with own_redis.client() as observer:
            assert clients_of_others(observer) <= BOUND
            # the SDK's idle time is a minute: its pool closes them as the service's does
            pool = client._backend.store.client.connection_pool  # type: ignore[attr-defined]
            pool.idle_seconds = IDLE_SECONDS
            wait_until(
                lambda: pool.close_idle() >= 0 and clients_of_others(observer) == 0, what="idle closed"
            )
