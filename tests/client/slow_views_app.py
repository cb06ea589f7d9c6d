"""Views slower than their lease, for gunicorn in tests (``tests.client.slow_views_app:app``).

``POST /reports`` is a ``@require_token`` view (``POST /orders`` a quick one) and
``POST /exports`` sits behind the Idempotency-Key middleware; both slow ones take
``SLOW_VIEW_SECONDS`` (3 s) under a 1 s lease / lock and count their runs in Redis,
so a test can tell whether a duplicate ran them again.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from flask import Flask

from token_service.client import TokenClient
from token_service.client.flask import require_token
from token_service.client.idempotency import IdempotencyMiddleware

SLOW_VIEW_SECONDS = 3.0
store = redis.Redis.from_url(os.environ["TEST_REDIS_URL"])
tokens = TokenClient.from_redis(store)
app = Flask(__name__)


@app.post("/reports")
@require_token(tokens, "report.build", lease_seconds=1)
def build_report() -> Any:
    run = store.incr("reports:runs")
    time.sleep(SLOW_VIEW_SECONDS)
    return {"run": run}, 201


@app.post("/orders")
@require_token(tokens, "order.place")
def place_order() -> Any:
    """Quick: counts its runs and what body it saw (a test cuts the body short)."""
    from flask import request

    store.incr("orders:runs")
    return {"bytes": len(request.get_data())}, 201


@app.post("/exports")
def export() -> Any:
    run = store.incr("exports:runs")
    time.sleep(SLOW_VIEW_SECONDS)
    return {"run": run}, 201


@app.get("/healthz")
def healthz() -> Any:
    return {"status": "ok"}


app.wsgi_app = IdempotencyMiddleware(  # type: ignore[method-assign]
    app.wsgi_app, store, lock_seconds=1, applies=lambda environ: environ.get("PATH_INFO") == "/exports"
)
