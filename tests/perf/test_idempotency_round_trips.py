"""The Idempotency-Key middlewares' round trips to Redis, counted with MONITOR (issue 32's budget).

A first request costs two commands, the claim (one plain ``SET … NX GET PX``, the
common record's keyed claim) and the store (``complete.lua``); a replay one, the
claim's SET, which finds the stored response. Renewal is left out: the lock is long
enough that no renewal falls inside a request. Counted as tests/perf/test_round_trips.py
counts the token operations (the commands a client sent; a script's own are not).
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterable
from typing import Any

import pytest
import redis
import redis.asyncio

from tests.perf.test_round_trips import command_names, commands_sent
from tests.support.processes import RedisServer
from token_service.client import asgi, wsgi
from token_service.records import read_record

pytestmark = pytest.mark.real

HEADERS = {"Authorization": "Bearer alice", "Content-Type": "application/json"}


def orders(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    body = b'{"order":1}'
    start_response("201 Created", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


def post_wsgi(app: Any, key: str) -> tuple[str, dict[str, str], bytes]:
    body = b'{"item":"book"}'
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/orders",
        "QUERY_STRING": "",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_AUTHORIZATION": HEADERS["Authorization"],
        "HTTP_IDEMPOTENCY_KEY": f'"{key}"',
        "wsgi.input": io.BytesIO(body),
    }
    started: list[Any] = []
    result = app(environ, lambda status, headers, exc_info=None: started.append((status, headers)))
    try:
        sent = b"".join(result)
    finally:
        getattr(result, "close", lambda: None)()
    status, headers = started[0]
    return status, dict(headers), sent


def test_a_wsgi_first_request_is_a_set_and_a_store_and_its_replay_one_set(
    redis_server: RedisServer, real_redis: redis.Redis
) -> None:
    app = wsgi.IdempotencyMiddleware(orders, redis_server.client())
    assert post_wsgi(app, "warm")[0].startswith("201")  # connection open, scripts loaded
    with commands_sent(redis_server) as first:
        status, headers, body = post_wsgi(app, "order-1")
    assert status.startswith("201")
    assert body == b'{"order":1}'
    assert "Idempotent-Replayed" not in headers
    with commands_sent(redis_server) as replay:
        status, headers, body = post_wsgi(app, "order-1")
    assert status.startswith("201")
    assert body == b'{"order":1}'
    assert headers["Idempotent-Replayed"] == "true"
    assert command_names(first) == ["SET", "EVALSHA"]
    assert command_names(replay) == ["SET"]
    # the record is the common one: SUCCEEDED, the request's fingerprint its binding
    stored = real_redis.get(app.store.key(HEADERS["Authorization"], "order-1"))
    assert stored is not None
    assert read_record(stored.decode()).state == "S"


async def orders_asgi(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    body = b'{"order":1}'
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 201, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def post_asgi(app: Any, key: str) -> tuple[int, dict[bytes, bytes], bytes]:
    body = b'{"item":"book"}'
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/orders",
        "query_string": b"",
        "headers": [
            (b"authorization", HEADERS["Authorization"].encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"idempotency-key", f'"{key}"'.encode()),
        ],
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the client stays: no disconnect
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = sent[0]
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


async def test_an_asgi_first_request_is_a_set_and_a_store_and_its_replay_one_set(
    redis_server: RedisServer, real_redis: redis.Redis
) -> None:
    client: Any = redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port)
    app = asgi.IdempotencyMiddleware(orders_asgi, client)
    try:
        assert (await post_asgi(app, "warm"))[0] == 201
        with commands_sent(redis_server) as first:
            status, headers, body = await post_asgi(app, "order-1")
        assert (status, body) == (201, b'{"order":1}')
        assert b"idempotent-replayed" not in headers
        with commands_sent(redis_server) as replay:
            status, headers, body = await post_asgi(app, "order-1")
        assert (status, body) == (201, b'{"order":1}')
        assert headers[b"idempotent-replayed"] == b"true"
    finally:
        await client.aclose()
    assert command_names(first) == ["SET", "EVALSHA"]
    assert command_names(replay) == ["SET"]
