"""FastAPI's ``@require_token(..., lease_seconds=2)`` around an endpoint slower than two of its leases,
under uvicorn on a real redis-server: the lease is renewed while it runs (its AsyncGuard), so the
duplicates at 2.5 s and 4.5 s get 409 instead of running it again, and once it finished a duplicate
gets the stored response. (The ASGI Idempotency-Key middleware on FastAPI: test_renewal_asgi.py.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from tests.integrations.servers import AppServer
from tests.support.processes import RedisServer, wait_until
from token_service.client import TokenClient

pytestmark = [pytest.mark.real, pytest.mark.slow]
DUPLICATES_AT = (2.5, 4.5)  # past the first 2 s lease, and past two


@pytest.fixture(scope="module")
def server(redis_server: RedisServer) -> Iterator[AppServer]:
    started = AppServer.uvicorn("tests.integrations.fastapi_app:app", {"TS_TEST_REDIS_URL": redis_server.url})
    yield started.start()
    started.stop()


def test_an_endpoint_slower_than_its_lease_runs_once(server: AppServer, real_redis: redis.Redis) -> None:
    token = TokenClient.from_redis(real_redis).generate("report.build").token
    url, headers = server.url + "/slow-reports", {"Idempotency-Token": token}
    first: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: first.append(httpx.post(url, headers=headers, timeout=60)))
    thread.start()
    duplicates: list[httpx.Response] = []
    try:
        wait_until(
            lambda: real_redis.get("runs:slow_report"), 30, interval_seconds=0.005, what="the endpoint"
        )
        started = time.monotonic()
        for at in DUPLICATES_AT:
            time.sleep(max(0.0, started + at - time.monotonic()))
            duplicates.append(httpx.post(url, headers=headers, timeout=60))
    finally:
        real_redis.rpush("release:slow_report", "go")
        thread.join(60)
    assert first[0].status_code == 201, first[0].text
    for duplicate in duplicates:
        assert duplicate.status_code == 409, duplicate.text
        assert duplicate.json()["code"] == "token_in_progress"
    replay = httpx.post(url, headers=headers, timeout=60)
    assert (replay.status_code, replay.headers["Idempotent-Replayed"]) == (201, "true")
    assert replay.json() == first[0].json() == {"run": 1}
    assert int(real_redis.get("runs:slow_report") or 0) == 1
