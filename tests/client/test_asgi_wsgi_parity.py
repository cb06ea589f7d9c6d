"""The ASGI and the WSGI Idempotency-Key middlewares answer every request of one script alike.

Two hand-written apps that behave the same (a pure WSGI one, a pure ASGI one, no
framework between them and the middleware), each behind its middleware, on one
real redis-server (each under its own key prefix). The same requests, in the
same order, go to both; every answer (status, body, headers but Date/Server) and
every run of the app must be the same: the two are one set of decisions
(``_idempotency_core``) on one set of Lua scripts, not two implementations.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio

from tests.support.processes import RedisServer
from token_service.client.asgi import IdempotencyMiddleware as AsgiMiddleware
from token_service.client.wsgi import IdempotencyMiddleware as WsgiMiddleware

pytestmark = pytest.mark.real
OPTIONS: dict[str, Any] = {"max_body_bytes": 4096, "lock_seconds": 30}


def answer(body: bytes, runs: list[bytes]) -> tuple[int, list[tuple[str, str]], bytes]:
    """What both apps answer: ``{"status": n}`` answers n, ``{"crash": true}`` raises."""
    runs.append(body)
    document = json.loads(body or b"{}")
    if document.get("crash"):
        raise RuntimeError("bug")
    status = int(document.get("status", 201))
    content = json.dumps({"run": len(runs), **document}).encode()
    headers = [("Content-Type", "application/json"), ("Location", f"/orders/{len(runs)}")]
    return status, [*headers, ("Set-Cookie", "s=1"), ("Content-Length", str(len(content)))], content


def wsgi_app(runs: list[bytes]) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        status, headers, content = answer(environ["wsgi.input"].read(length), runs)
        start_response(f"{status} X", headers)
        return [content]

    return app


def asgi_app(runs: list[bytes]) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        status, headers, content = answer(body, runs)
        raw = [(name.lower().encode(), value.encode()) for name, value in headers]
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": content})

    return app


def server_errors(app: Any) -> Any:
    """What a WSGI server does with an app that raises: a bare 500 (as httpx's ASGITransport does)."""

    def serve(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        try:
            return list(app(environ, start_response))
        except RuntimeError:
            start_response("500 Internal Server Error", [], sys.exc_info())
            return [b""]

    return serve


# (method, Idempotency-Key or None, Authorization or None, body): run in this order against both
SCRIPT: list[tuple[str, str | None, str | None, bytes]] = [
    ("POST", None, "Bearer alice", b'{"sku": "A"}'),  # 400: required
    ("POST", '"a\x7fb"', "Bearer alice", b'{"sku": "A"}'),  # 400: not printable
    ("POST", '""', "Bearer alice", b'{"sku": "A"}'),  # 400: empty
    ("POST", "k" * 256, "Bearer alice", b'{"sku": "A"}'),  # 400: too long
    ("POST", '"k1"', None, b'{"sku": "A"}'),  # 400: no identity
    ("POST", '"k1"', "Bearer alice", b'{"blob": "' + b"x" * 5000 + b'"}'),  # 413
    ("GET", '"k1"', "Bearer alice", b""),  # not guarded: runs
    ("POST", '"k1"', "Bearer alice", b'{"sku": "A", "qty": 1}'),  # runs, stored
    ("POST", '"k1"', "Bearer alice", b'{"qty":1,"sku":"A"}'),  # replayed (same JSON)
    ("POST", '"k1"', "Bearer alice", b'{"sku": "B"}'),  # 422
    ("POST", '"k1"', "Bearer bob", b'{"sku": "B"}'),  # bob's own k1: runs
    ("PATCH", "k1", "Bearer alice", b'{"sku": "A", "qty": 1}'),  # 422: the same key unquoted, PATCH
    ("POST", '"k2"', "Bearer alice", b'{"status": 503}'),  # not stored
    ("POST", '"k2"', "Bearer alice", b'{"status": 503}'),  # runs again
    ("POST", '"k3"', "Bearer alice", b'{"status": 429}'),  # not stored
    ("POST", '"k3"', "Bearer alice", b'{"status": 404}'),  # so another body is not a 422: runs, stored
    ("POST", '"k3"', "Bearer alice", b'{"status": 404}'),  # replayed
    ("POST", '"k4"', "Bearer alice", b'{"crash": true}'),  # 500, the key freed
    ("POST", '"k4"', "Bearer alice", b'{"crash": true}'),  # runs again
    ("POST", '"k4"', "Bearer alice", b'{"sku": "C"}'),  # after two exceptions: still free
    ("POST", '"k4"', "Bearer alice", b'{"sku": "C"}'),  # replayed
    # two Idempotency-Key fields, as servers join them (issue 26): 400, never a key "k5, k6"
    ("POST", '"k5", "k6"', "Bearer alice", b'{"sku": "D"}'),
    ("POST", "k5, k6", "Bearer alice", b'{"sku": "D"}'),
    ("POST", "k5,k6", "Bearer alice", b'{"sku": "D"}'),
    ("POST", '"k5",', "Bearer alice", b'{"sku": "D"}'),
    ("POST", '"k5, k6"', "Bearer alice", b'{"sku": "D"}'),  # one sf-string holding a comma: one key, runs
    ("POST", '"k5"x', "Bearer alice", b'{"sku": "D"}'),  # 400: not an sf-string
]


def comparable(response: httpx.Response) -> tuple[int, bytes, list[tuple[str, str]]]:
    headers = sorted(
        (name.lower(), value)
        for name, value in response.headers.items()
        if name.lower() not in ("date", "server")
    )
    return response.status_code, response.content, headers


async def test_both_middlewares_answer_one_script_alike(
    redis_server: RedisServer, real_redis: redis.Redis
) -> None:
    wsgi_runs: list[bytes] = []
    asgi_runs: list[bytes] = []
    wsgi = WsgiMiddleware(wsgi_app(wsgi_runs), real_redis, key_prefix="wsgi:", **OPTIONS)
    async_redis = redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port)
    asgi = AsgiMiddleware(asgi_app(asgi_runs), async_redis, key_prefix="asgi:", **OPTIONS)
    wsgi_client = httpx.Client(
        transport=httpx.WSGITransport(app=server_errors(wsgi), raise_app_exceptions=False),
        base_url="http://t",
    )
    asgi_client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=asgi, raise_app_exceptions=False), base_url="http://t"
    )
    statuses = []
    try:
        for number, (method, key, user, body) in enumerate(SCRIPT):
            headers = {"Content-Type": "application/json"}
            if key is not None:
                headers["Idempotency-Key"] = key
            if user is not None:
                headers["Authorization"] = user
            sent = {"content": body, "headers": {n: v.encode("latin-1") for n, v in headers.items()}}
            wsgi_answer = wsgi_client.request(method, "/orders", **sent)
            asgi_answer = await asgi_client.request(method, "/orders", **sent)
            assert comparable(wsgi_answer) == comparable(asgi_answer), (number, method, key, body)
            assert len(wsgi_runs) == len(asgi_runs), (number, method, key, body)
            statuses.append(wsgi_answer.status_code)
    finally:
        wsgi_client.close()
        await asgi_client.aclose()
        await async_redis.aclose()
    # the script meant what its comments say
    assert statuses[:12] == [400, 400, 400, 400, 400, 413, 201, 201, 201, 422, 201, 422]
    assert statuses[12:21] == [503, 503, 429, 404, 404, 500, 500, 201, 201]
    assert statuses[21:] == [400, 400, 400, 400, 201, 400]
    assert len(wsgi_runs) == 11
    assert sorted(key.decode().split(":", 1)[1] for key in real_redis.keys("wsgi:*")) == sorted(
        key.decode().split(":", 1)[1] for key in real_redis.keys("asgi:*")
    )
