"""A WSGI app behind IdempotencyMiddleware, for gunicorn in tests (``tests.client.middleware_app:app``).

Each run of the view counts itself in Redis (``orders:runs``) and takes a
moment, so simultaneous repeats across worker processes really overlap.
``POST /answers/<status>`` answers that status (counted in ``answers:runs``);
``POST /reports`` is a ``@require_token`` view that answers with ``send_file``
(counted in ``reports:runs``; the middleware leaves it alone).
"""

from __future__ import annotations

import io
import os
import time
from typing import Any

import redis
from flask import Flask, request, send_file

from token_service.client import TokenClient
from token_service.client.flask import require_token
from token_service.client.wsgi import IdempotencyMiddleware

REPORT = b"%PDF-1.4 receipt " * 4096  # 68 KB: over require_token's 8 KB body cap
store = redis.Redis.from_url(os.environ["TEST_REDIS_URL"])
tokens = TokenClient.from_redis(store)
app = Flask(__name__)


@app.post("/answers/<int:status>")
def answer(status: int) -> Any:
    store.incr("answers:runs")
    return {"status": status}, status, {"Retry-After": "1"}


@app.post("/reports")
@require_token(tokens, "report.create")
def create_report() -> Any:
    store.incr("reports:runs")
    return send_file(io.BytesIO(REPORT), mimetype="application/pdf", download_name="receipt.pdf")


@app.post("/orders")
def create_order() -> Any:
    run = store.incr("orders:runs")
    time.sleep(0.3)
    return {"run": run, "pid": os.getpid(), **(request.get_json() or {})}, 201


@app.get("/healthz")
def healthz() -> Any:
    return {"status": "ok"}


app.wsgi_app = IdempotencyMiddleware(  # type: ignore[method-assign]
    app.wsgi_app, store, applies=lambda environ: environ.get("PATH_INFO") != "/reports"
)
