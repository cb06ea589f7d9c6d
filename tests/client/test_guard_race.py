"""Many threads and processes run the same guarded function with one token, released together.

The body runs exactly once (it counts its runs in Redis) and every caller —
direct or over HTTP, thread or process — gets the same result back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from typing import Any

import pytest
import redis

from tests.support.processes import REPO_ROOT, Gunicorn, RedisServer, wait_until
from tests.support.service import API_KEY
from token_service.client import AsyncTokenClient, TokenClient

pytestmark = [pytest.mark.real, pytest.mark.slow]
SCOPE = "race.charge"
PROCESSES = 4
THREADS = 8

PROCESS_SCRIPT = textwrap.dedent(
    """
    import json, sys, time, uuid
    import redis
    from token_service.client import TokenClient

    port, token = int(sys.argv[1]), sys.argv[2]
    r = redis.Redis(host="127.0.0.1", port=port)
    client = TokenClient.from_redis(r)

    def charge():
        r.incr("race:runs")
        time.sleep(0.3)
        return {"charge": uuid.uuid4().hex, "by": "process"}

    r.incr("race:ready")
    r.blpop(["race:go"], timeout=30)
    print(json.dumps(client.guard(token, "race.charge", wait_seconds=20).run(charge)))
    """
)


def test_threads_and_processes_run_the_body_once(
    redis_server: RedisServer, real_redis: redis.Redis, gunicorn: Gunicorn
) -> None:
    direct = TokenClient.from_redis(real_redis)
    over_http = TokenClient(gunicorn.url, API_KEY)
    token = direct.generate(SCOPE).token

    processes = [
        subprocess.Popen(
            [sys.executable, "-c", PROCESS_SCRIPT, str(redis_server.port), token],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    wait_until(
        lambda: int(real_redis.get("race:ready") or 0) == PROCESSES, timeout_seconds=60, what="processes"
    )

    barrier = threading.Barrier(THREADS + 1)
    results: list[Any] = []
    errors: list[BaseException] = []

    def charge() -> dict[str, str]:
        real_redis.incr("race:runs")
        time.sleep(0.3)
        return {"charge": uuid.uuid4().hex, "by": "thread"}

    def caller(client: TokenClient) -> None:
        barrier.wait()
        try:
            results.append(client.guard(token, SCOPE, wait_seconds=20).run(charge))
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=caller, args=(direct if i % 2 else over_http,)) for i in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    barrier.wait()
    real_redis.rpush("race:go", *["go"] * PROCESSES)
    for thread in threads:
        thread.join(timeout=30)
    for process in processes:
        out, err = process.communicate(timeout=30)
        assert process.returncode == 0, err
        results.append(json.loads(out))
    over_http.close()

    assert errors == []
    assert len(results) == THREADS + PROCESSES
    assert int(real_redis.get("race:runs") or 0) == 1
    assert all(result == results[0] for result in results), results
    assert direct.verify(token).result == results[0]


async def test_asyncio_tasks_run_the_body_once(redis_server: RedisServer, real_redis: redis.Redis) -> None:
    import asyncio

    import redis.asyncio

    async_redis = redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port)
    client = AsyncTokenClient.from_redis(async_redis)
    token = (await client.generate(SCOPE)).token
    runs = 0

    async def charge() -> str:
        nonlocal runs
        runs += 1
        await asyncio.sleep(0.2)
        return uuid.uuid4().hex

    results = await asyncio.gather(
        *(client.guard(token, SCOPE, wait_seconds=20).run(charge) for _ in range(20))
    )
    await async_redis.aclose()
    assert runs == 1
    assert len(set(results)) == 1
