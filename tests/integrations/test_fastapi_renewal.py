"""FastAPI's ``@require_token``: its hooks, and ``lease_seconds=2`` around an endpoint slower than two leases,
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


def test_require_token_passes_the_guard_hooks(server: AppServer, real_redis: redis.Redis) -> None:
    """on_replay / on_conflict / on_mismatch given to FastAPI's @require_token reach the guard."""
    tokens = TokenClient.from_redis(real_redis)
    token = tokens.generate("payment.create", subject="alice").token

    def hooked(token: str, user: str) -> int:
        headers = {"Idempotency-Token": token, "X-User-Id": user}
        return httpx.post(server.url + "/hooked", headers=headers, timeout=60).status_code

    assert hooked(token, "bob") == 403
    assert hooked(token, "alice") == 201
    assert hooked(token, "alice") == 201  # replayed
    used = tokens.generate("payment.create", subject="alice").token
    tokens.consume(used, "payment.create", subject="alice")
    assert hooked(used, "alice") == 409
    counts = {name: int(real_redis.get(f"hooks:{name}") or 0) for name in ("mismatch", "replay", "conflict")}
    assert counts == {"mismatch": 1, "replay": 1, "conflict": 1}
    assert int(real_redis.get("runs:hooked") or 0) == 1
