"""The Idempotency-Key middleware under gunicorn: repeats spread over worker processes run once."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from tests.support.processes import REPO_ROOT, RedisServer, free_port, wait_until

pytestmark = [pytest.mark.real, pytest.mark.slow]


@pytest.fixture
def orders_url(redis_server: RedisServer, real_redis: redis.Redis) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "3",
            "tests.client.middleware_app:app",
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "TEST_REDIS_URL": redis_server.url},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(url + "/healthz", timeout=1).status_code == 200, 20, what="gunicorn")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_simultaneous_repeats_across_workers_run_once(orders_url: str, real_redis: redis.Redis) -> None:
    headers = {"Idempotency-Key": '"order-1"', "Authorization": "Bearer client-a"}
    barrier = threading.Barrier(9)
    answers: list[httpx.Response] = []

    def send() -> None:
        with httpx.Client(timeout=10) as client:
            barrier.wait()
            answers.append(client.post(orders_url + "/orders", json={"sku": "A"}, headers=headers))

    threads = [threading.Thread(target=send) for _ in range(9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert int(real_redis.get("orders:runs") or 0) == 1
    statuses = sorted(answer.status_code for answer in answers)
    assert statuses.count(201) >= 1
    assert set(statuses) <= {201, 409}
    # after the first finished, every repeat — whichever worker takes it — is the stored response
    first: Any = None
    for _ in range(6):
        replay = httpx.post(orders_url + "/orders", json={"sku": "A"}, headers=headers, timeout=10)
        assert replay.status_code == 201
        assert replay.headers["Idempotent-Replayed"] == "true"
        first = first or replay.content
        assert replay.content == first
    assert int(real_redis.get("orders:runs") or 0) == 1
    other = httpx.post(orders_url + "/orders", json={"sku": "B"}, headers=headers, timeout=10)
    assert other.status_code == 422
