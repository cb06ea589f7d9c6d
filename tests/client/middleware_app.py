"""A WSGI app behind IdempotencyMiddleware, for gunicorn in tests (``tests.client.middleware_app:app``).

Each run of the view counts itself in Redis (``orders:runs``) and takes a
moment, so simultaneous repeats across worker processes really overlap.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from flask import Flask, request

from token_service.client.idempotency import IdempotencyMiddleware

store = redis.Redis.from_url(os.environ["TEST_REDIS_URL"])
app = Flask(__name__)


@app.post("/orders")
def create_order() -> Any:
    run = store.incr("orders:runs")
    time.sleep(0.3)
    return {"run": run, "pid": os.getpid(), **(request.get_json() or {})}, 201


@app.get("/healthz")
def healthz() -> Any:
    return {"status": "ok"}


app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, store)  # type: ignore[method-assign]
