"""The example's Celery app: two tasks behind ``IdempotentTask``.

Broker: ``CELERY_BROKER_URL`` (default RabbitMQ on localhost, guest/guest).
Keys and results: ``TOKEN_SERVICE_REDIS_URL`` (default the local Redis, db 0);
Celery's own results go to db 1 of the same Redis.
"""

from __future__ import annotations

import os
from typing import Any

import redis
from celery import Celery

from token_service.client import TokenClient
from token_service.client.celery import IdempotentTask

REDIS_URL = os.environ.get("TOKEN_SERVICE_REDIS_URL", "redis://127.0.0.1:6379/0")
QUEUE = os.environ.get("EXAMPLE_QUEUE", "token-service-example")

app = Celery(
    "celery_app",
    broker=os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    backend=REDIS_URL.rsplit("/", 1)[0] + "/1",
)
app.conf.update(
    task_default_queue=QUEUE,
    task_acks_late=True,  # a message is acked after its task ran: a worker killed mid-task is redelivered
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)

tokens = TokenClient.from_redis(REDIS_URL)
emails = redis.Redis.from_url(REDIS_URL)  # stands in for an e-mail provider: a list of what was sent


@app.task(base=IdempotentTask, token_client=tokens, name="example.send_receipt")
def send_receipt(order_id: str, email: str) -> dict[str, Any]:
    """Keyed by the task id: a redelivered message sends nothing twice."""
    emails.rpush("example:sent", f"receipt {order_id} to {email}")
    return {"order": order_id, "sent_to": email}


@app.task(
    base=IdempotentTask,
    token_client=tokens,
    name="example.charge",
    idempotency_key="order_id",  # two messages for one order charge once
    idempotency_lease_seconds=30,
)
def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
    emails.rpush("example:sent", f"charged {amount_cents} for {order_id}")
    return {"order": order_id, "charged": amount_cents}
