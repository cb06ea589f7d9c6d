"""The ASGI Idempotency-Key middleware on a real uvicorn: an 8 s request under a 2 s lock runs once.

Its claim is renewed while the app runs (``core.ahold``), so the duplicates at
2.5 s and 4.5 s get 409 instead of running the app again. The lock is 2 s so that
its renewer (every third of it) has time to run on a loaded machine; the request lasts 8 s so
that they still land while it runs when the test process is slow to notice its
start (a 3 s request left 0.5 s and failed once at load 18).
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import redis

from tests.client.test_asgi_uvicorn import Server, start_uvicorn
from tests.support.processes import RedisServer, wait_until

pytestmark = [pytest.mark.real, pytest.mark.slow]


@pytest.mark.parametrize("app", ["starlette_app", "fastapi_app"])
def test_a_request_slower_than_its_lock_runs_once(
    app: str, redis_server: RedisServer, real_redis: redis.Redis
) -> None:
    process, url = start_uvicorn(app, redis_server.url, TEST_LOCK_SECONDS="2")
    try:
        server = Server(url, real_redis)
        first: list[httpx.Response] = []
        thread = threading.Thread(target=lambda: first.append(server.post({"sleep": 8})))
        thread.start()
        wait_until(lambda: server.runs == 1, 30, interval_seconds=0.005, what="the app to start")
        started = time.monotonic()
        for at in (2.5, 4.5):
            time.sleep(max(0.0, started + at - time.monotonic()))
            assert server.post({"sleep": 8}).status_code == 409
        thread.join(30)
        assert first[0].status_code == 201
        replay = server.post({"sleep": 8})
        assert replay.headers["Idempotent-Replayed"] == "true"
        assert replay.json() == first[0].json()
        assert server.runs == 1
    finally:
        process.terminate()
        process.wait(20)
