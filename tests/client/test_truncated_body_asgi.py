"""The ASGI Idempotency-Key middleware on a body that ends early: a 400, nothing claimed, nothing run."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
import redis.asyncio

from tests.support.processes import RedisServer
from token_service.client.asgi import IdempotencyMiddleware

pytestmark = [pytest.mark.real]
BODY = json.dumps({"sku": "A", "note": "0123456789"}).encode()


def _scope(declared: int | None) -> dict[str, Any]:
    headers = [
        (b"idempotency-key", b'"cut-short"'),
        (b"authorization", b"Bearer alice"),
        (b"content-type", b"application/json"),
    ]
    if declared is not None:
        headers.append((b"content-length", str(declared).encode()))
    return {"type": "http", "method": "POST", "path": "/orders", "query_string": b"", "headers": headers}


async def _call(redis_server: RedisServer, messages: list[dict[str, Any]], declared: int | None) -> Any:
    ran: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        ran.append((await receive())["body"])
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"{}", "more_body": False})

    queue = list(messages)

    async def receive() -> dict[str, Any]:
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    client = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        await IdempotencyMiddleware(app, client)(_scope(declared), receive, send)
    finally:
        await client.aclose()
    return ran, sent


@pytest.mark.parametrize(
    ("messages", "declared"),
    [
        # the client left after 10 bytes: the server says http.disconnect before more_body=False
        ([{"type": "http.request", "body": BODY[:10], "more_body": True}], len(BODY)),
        ([{"type": "http.request", "body": BODY[:10], "more_body": True}], None),
        # a last message that leaves the body short of its Content-Length
        ([{"type": "http.request", "body": BODY[:10], "more_body": False}], len(BODY)),
    ],
)
async def test_a_body_that_ends_early_is_a_400_and_claims_nothing(
    redis_server: RedisServer, real_redis: redis.Redis, messages: list[dict[str, Any]], declared: int | None
) -> None:
    ran, sent = await _call(redis_server, messages, declared)
    assert ran == []
    assert sent[0]["status"] == 400
    assert (b"content-type", b"application/problem+json") in sent[0]["headers"]
    problem = json.loads(sent[1]["body"])
    assert problem["code"] == "invalid_request"
    assert "ended before its Content-Length" in problem["detail"]
    assert real_redis.keys("ts:ik:*") == []
    # the retry with the whole body runs, and is the one the key keeps
    whole = [{"type": "http.request", "body": BODY, "more_body": False}]
    ran, sent = await _call(redis_server, whole, len(BODY))
    assert ran == [BODY]
    assert sent[0]["status"] == 201
    assert len(real_redis.keys("ts:ik:*")) == 1
