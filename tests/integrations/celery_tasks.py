"""The Celery app the worker processes of tests/integrations/test_celery.py run.

Configured from the environment the test sets: the broker (RabbitMQ), the
queue (one per test session) and the redis-server the test started (keys and
results).
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery
from redis.backoff import NoBackoff
from redis.retry import Retry

from token_service.client import TokenClient
from token_service.client.celery import IdempotentTask

REDIS_URL = os.environ.get("TS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
QUEUE = os.environ.get("TS_TEST_QUEUE", "token-service-tests")

app = Celery(
    "ts_tests",
    broker=os.environ.get("TS_TEST_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    backend=REDIS_URL.rsplit("/", 1)[0] + "/1",
)
app.conf.update(
    task_default_queue=QUEUE,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    task_serializer="json",
    result_serializer="json",
)

tokens = TokenClient.from_redis(REDIS_URL)
counters = redis.Redis.from_url(REDIS_URL)


class Declined(Exception):
    pass


@app.task(base=IdempotentTask, token_client=tokens, name="tests.record")
def record(label: str) -> dict[str, Any]:
    """Keyed by its task id."""
    run = counters.incr(f"runs:record:{label}")
    time.sleep(0.2)
    return {"label": label, "run": run}


@app.task(
    base=IdempotentTask,
    token_client=tokens,
    name="tests.charge",
    idempotency_key="order_id",
    idempotency_poll_seconds=0.5,
)
def charge(order_id: str, amount: int) -> dict[str, Any]:
    """Keyed by the order: two messages for one order run once."""
    run = counters.incr(f"runs:charge:{order_id}")
    time.sleep(0.5)  # every duplicate arrives while the first runs
    return {"order": order_id, "amount": amount, "run": run}


@app.task(
    base=IdempotentTask,
    token_client=tokens,
    name="tests.slow",
    idempotency_lease_seconds=2,
    idempotency_terminal=(Declined,),
)
def slow(job: str) -> dict[str, Any]:
    """The first run hangs until its worker is killed; the next finishes."""
    start = counters.incr(f"starts:slow:{job}")
    seconds, micros = counters.time()  # when, on the clock leases are kept by
    counters.set(f"at:slow:{job}:{start}", seconds * 1000 + micros // 1000)
    if start == 1:
        time.sleep(120)
    return {"job": job, "start": start}


@app.task(
    base=IdempotentTask,
    token_client=tokens,
    name="tests.refund",
    idempotency_key="order_id",
    idempotency_terminal=(Declined,),
)
def refund(order_id: str) -> None:
    counters.incr(f"runs:refund:{order_id}")
    raise Declined("refund declined")


@app.task(
    base=IdempotentTask,
    token_client=TokenClient.from_redis("redis://127.0.0.1:1/0", retry=1, timeout=0.5),
    name="tests.store_down",
    max_retries=2,
    idempotency_poll_seconds=0.2,
)
def store_down(label: str) -> None:
    counters.incr(f"runs:store_down:{label}")


# The keys' Redis behind tests/support/tcp_proxy.py (tests/integrations/test_celery_outcome.py):
# a socket timeout short enough that the client's own retries end inside a blip, as a refused
# connection's do.
_PROXIED_URL = os.environ.get("TS_TEST_PROXIED_REDIS_URL")
proxied = (
    TokenClient.from_redis(
        redis.Redis.from_url(
            _PROXIED_URL, socket_timeout=0.25, socket_connect_timeout=0.25, retry=Retry(NoBackoff(), 0)
        )
    )
    if _PROXIED_URL
    else tokens
)


@app.task(
    base=IdempotentTask,
    token_client=proxied,
    name="tests.settle_blip",
    idempotency_key="order_id",
    idempotency_lease_seconds=3,
    idempotency_poll_seconds=0.5,
)
def settle_blip(order_id: str) -> dict[str, Any]:
    """Says it ran, then waits for the test to cut its keys' Redis off before it returns."""
    run = counters.incr(f"runs:settle_blip:{order_id}")
    counters.set(f"ran:settle_blip:{order_id}:{run}", 1)
    deadline = time.monotonic() + 60
    while not counters.get(f"go:settle_blip:{order_id}") and time.monotonic() < deadline:
        time.sleep(0.02)
    return {"order": order_id, "run": run}
