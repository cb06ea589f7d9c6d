"""Views slower than their lease, for gunicorn in tests (``tests.client.slow_views_app:app``).

``POST /reports`` is a ``@require_token`` view (``POST /orders`` a quick one) and
``POST /exports`` sits behind the Idempotency-Key middleware; both slow ones run
under a 2 s lease / lock and count their runs in Redis, so a test can tell
whether a duplicate ran them again. Their first run lasts until the test pushes
``<name>:release`` (after its duplicates), not a fixed time, so the duplicates
land while it runs however slowly a loaded machine sends them; a later run
returns at once.
"""

from __future__ import annotations

import os
from typing import Any

import redis
from flask import Flask

from token_service.client import TokenClient
from token_service.client.flask import require_token
from token_service.client.wsgi import IdempotencyMiddleware

LEASE_SECONDS = 2  # 1 s left the renewer 0.67 s to renew in, too little on a loaded CI machine
RELEASE_TIMEOUT_SECONDS = 30  # a first run the test never releases (it failed first) still ends
# redis-py's socket timeout (5 s by default in redis-py 8) must outlast the first run's BLPOP: the
# release comes after the duplicate at 4.5 s, past 5 s on a loaded machine
store = redis.Redis.from_url(os.environ["TEST_REDIS_URL"], socket_timeout=RELEASE_TIMEOUT_SECONDS + 10)
tokens = TokenClient.from_redis(store)
app = Flask(__name__)


@app.post("/reports")
@require_token(tokens, "report.build", lease_seconds=LEASE_SECONDS)
def build_report() -> Any:
    run = store.incr("reports:runs")
    _first_waits_for_release(run, "reports:release")
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
    _first_waits_for_release(run, "exports:release")
    return {"run": run}, 201


def _first_waits_for_release(run: int, release_key: str) -> None:
    if run == 1:
        # which worker holds it: a test may kill that process mid-view
        store.set(release_key.replace(":release", ":pid"), os.getpid())
        store.blpop([release_key], timeout=RELEASE_TIMEOUT_SECONDS)


@app.get("/healthz")
def healthz() -> Any:
    return {"status": "ok"}


app.wsgi_app = IdempotencyMiddleware(  # type: ignore[method-assign]
    app.wsgi_app,
    store,
    lock_seconds=LEASE_SECONDS,
    applies=lambda environ: environ.get("PATH_INFO") == "/exports",
)
