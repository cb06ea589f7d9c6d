"""Every kind of response behind ``@require_token`` and the Idempotency-Key middleware, for gunicorn in tests
(``tests.client.response_kinds_app:app``; tests/client/test_response_kinds_gunicorn.py).

Under ``/token/...`` a ``@require_token`` view, under ``/key/...`` the same view
behind the WSGI middleware (which leaves ``/token/`` alone). Each view counts its
runs in Redis (``runs:<path>``). Kinds (the last part of the path):

- ``file``: ``send_file()`` of the file at ``TEST_REPORT_PATH`` (gunicorn's ``wsgi.file_wrapper``;
  Werkzeug marks it direct passthrough), 4 MiB (so a client can leave half-way); ``HEAD`` too;
- ``stream``: a generator of ``?chunks=`` chunks of ``CHUNK`` bytes (``?chunk=`` overrides);
- ``passthrough``: a plain iterable with ``direct_passthrough=True``;
- ``status``: answers ``?status=`` (a 429, a 503...).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis
from flask import Flask, Response, request, send_file

from token_service.client import TokenClient
from token_service.client.flask import require_token
from token_service.client.wsgi import IdempotencyMiddleware

CHUNK = 64 * 1024
CAP = int(os.environ.get("TEST_STORAGE_CAP", str(64 * 1024)))  # the largest body kept for duplicates
SCOPE = "report.create"

store = redis.Redis.from_url(os.environ["TEST_REDIS_URL"])
tokens = TokenClient.from_redis(store)
REPORT = Path(os.environ["TEST_REPORT_PATH"])  # written by the test
app = Flask(__name__)


def _answer(kind: str) -> Any:
    store.incr(f"runs:{request.path}")
    if kind == "file":
        return send_file(REPORT, mimetype="application/pdf", download_name="report.pdf")
    if kind == "stream":
        chunks = int(request.args.get("chunks", "4"))
        size = int(request.args.get("chunk", str(CHUNK)))

        def generate() -> Iterator[bytes]:
            for _ in range(chunks):
                yield b"x" * size

        return Response(generate(), mimetype="application/octet-stream")
    if kind == "passthrough":
        return Response(iter([b"part one, ", b"part two"]), mimetype="text/plain", direct_passthrough=True)
    if kind == "status":
        status = int(request.args["status"])
        return {"status": status}, status
    raise ValueError(kind)


@app.route("/token/<kind>", methods=["POST", "HEAD"])
@require_token(tokens, SCOPE, max_body_bytes=CAP)
def with_token(kind: str) -> Any:
    return _answer(kind)


@app.route("/key/<kind>", methods=["POST"])
def with_key(kind: str) -> Any:
    return _answer(kind)


@app.get("/healthz")
def healthz() -> Any:
    return {"status": "ok", "pid": os.getpid()}


app.wsgi_app = IdempotencyMiddleware(  # type: ignore[method-assign]
    app.wsgi_app,
    store,
    max_stored_bytes=CAP,
    applies=lambda environ: environ.get("PATH_INFO", "").startswith("/key/"),
)
