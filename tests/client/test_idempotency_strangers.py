"""What one unauthenticated client can make the Idempotency-Key middlewares store (issue 31, 4).

The key is claimed under the raw ``Authorization`` header before the app has
looked at it, so anyone can pick a fresh namespace per request by sending a
random bearer value. Two things bound what that buys them, in all three
middlewares (WSGI, ASGI, Django: one core):

- a refusal of credentials (401, 403, 407) is never stored, whatever
  ``store_status`` says: the key is freed and no record is left;
- a 4xx body is kept up to ``max_stored_4xx_bytes`` (4 KiB by default), so an
  app whose 400 echoes its input (FastAPI's 422 does) stores a small record
  marked omitted, not a copy of every request.

On a real redis-server, with each record's bytes as Redis holds them (``STRLEN``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory, override_settings

from tests.integrations.test_require_token_parity import configure_django
from tests.support.processes import RedisServer
from token_service.client._idempotency_options import DEFAULT_MAX_STORED_4XX_BYTES, IdempotencyOptions
from token_service.client.asgi import IdempotencyMiddleware as AsgiMiddleware
from token_service.client.django import IdempotencyKeyMiddleware
from token_service.client.wsgi import IdempotencyMiddleware as WsgiMiddleware

pytestmark = pytest.mark.real

ATTACKS = 500
# a stored 4xx's head: its status, headers and omitted length, and the record's fingerprint and marker
HEAD_BYTES = 400


def answer(body: bytes) -> tuple[int, bytes]:
    """The app behind every middleware: ``{"status": n}`` answers n, echoing the request (as FastAPI's
    422 echoes the input it refused); 401 for a bearer it does not know."""
    document = json.loads(body or b"{}")
    status = int(document.get("status", 401))
    return status, json.dumps({"detail": "refused", "input": document}).encode()


def wsgi_app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    status, content = answer(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
    start_response(f"{status} X", [("Content-Type", "application/json")])
    return [content]


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    status, content = answer(body)
    await send(
        {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]}
    )
    await send({"type": "http.response.body", "body": content})


def django_view(request: HttpRequest) -> HttpResponse:
    status, content = answer(request.body)
    return HttpResponse(content, status=status, content_type="application/json")


Send = Callable[[dict[str, str], bytes], int]
Senders = Callable[..., Send]


@pytest.fixture
def senders(redis_server: RedisServer) -> Iterator[Senders]:
    """``senders(framework, **options)``: a function that posts one request through that middleware
    (on ``redis_server``) and answers its status; everything it opened is closed after the test."""
    with contextlib.ExitStack() as stack:

        def wsgi(**options: Any) -> Send:
            middleware = WsgiMiddleware(wsgi_app, stack.enter_context(redis_server.client()), **options)
            transport = httpx.WSGITransport(app=middleware)
            client = stack.enter_context(httpx.Client(transport=transport, base_url="http://t"))
            return lambda headers, body: client.post("/orders", content=body, headers=headers).status_code

        def asgi(**options: Any) -> Send:
            loop = asyncio.new_event_loop()
            stack.callback(loop.close)
            store = redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port)
            stack.callback(lambda: loop.run_until_complete(store.aclose()))
            transport = httpx.ASGITransport(app=AsgiMiddleware(asgi_app, store, **options))
            client = httpx.AsyncClient(transport=transport, base_url="http://t")
            stack.callback(lambda: loop.run_until_complete(client.aclose()))

            def send(headers: dict[str, str], body: bytes) -> int:
                return loop.run_until_complete(
                    client.post("/orders", content=body, headers=headers)
                ).status_code

            return send

        def django(**options: Any) -> Send:
            configure_django()
            service = {"REDIS_URL": f"redis://127.0.0.1:{redis_server.port}/0", "IDEMPOTENCY_KEY": options}
            with override_settings(TOKEN_SERVICE=service):
                middleware = IdempotencyKeyMiddleware(django_view)
            stack.callback(middleware.store.client.close)
            factory = RequestFactory()

            def send(headers: dict[str, str], body: bytes) -> int:
                request = factory.post("/orders", data=body, content_type="application/json", headers=headers)
                return int(middleware(request).status_code)

            return send

        makers = {"wsgi": wsgi, "asgi": asgi, "django": django}
        yield lambda framework, **options: makers[framework](**options)


FRAMEWORKS = ("wsgi", "asgi", "django")


def stranger(status: int | None = None, **fields: Any) -> tuple[dict[str, str], bytes]:
    """One request of an unauthenticated client: a random bearer value, a fresh key."""
    headers = {
        "Authorization": f"Bearer {secrets.token_urlsafe(16)}",
        "Idempotency-Key": f'"{secrets.token_urlsafe(8)}"',
        "Content-Type": "application/json",
    }
    document = {**fields, **({} if status is None else {"status": status})}
    return headers, json.dumps(document).encode()


def records(client: redis.Redis) -> dict[bytes, int]:
    """Every Idempotency-Key record and the bytes Redis holds for its value."""
    return {key: int(client.strlen(key)) for key in client.scan_iter(match="ts:ik:*", count=1000)}


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("status", [401, 403, 407])
def test_random_bearer_values_against_a_refusing_app_leave_no_record(
    senders: Senders, real_redis: redis.Redis, framework: str, status: int
) -> None:
    send = senders(framework)
    answered = [send(*stranger(status)) for _ in range(ATTACKS if status == 401 else 20)]
    assert answered == [status] * len(answered)
    assert records(real_redis) == {}


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_refusal_of_credentials_is_not_stored_whatever_the_policy_says(
    senders: Senders, real_redis: redis.Redis, framework: str
) -> None:
    send = senders(framework, store_status=lambda status: status < 500)
    headers, body = stranger(401)
    assert [send(headers, body), send(headers, body)] == [401, 401]
    assert records(real_redis) == {}
    # the policy still holds for what is a result
    headers, body = stranger(404)
    assert send(headers, body) == 404
    assert len(records(real_redis)) == 1


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_4xx_that_echoes_its_input_is_stored_at_most_to_the_cap(
    senders: Senders, real_redis: redis.Redis, framework: str
) -> None:
    send = senders(framework)
    sent = 0
    for _ in range(50):
        headers, body = stranger(400, blob="x" * 66_000)
        sent += len(body)
        assert send(headers, body) == 400
    kept = records(real_redis)
    assert len(kept) == 50
    # a record each (the request's answer is kept), none of them the 66 KB echo
    assert max(kept.values()) <= HEAD_BYTES
    assert sum(kept.values()) < sent / 100


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_4xx_under_the_cap_is_replayed_whole_and_the_cap_is_a_setting(
    senders: Senders, real_redis: redis.Redis, framework: str
) -> None:
    send = senders(framework)
    headers, body = stranger(422, blob="x" * (DEFAULT_MAX_STORED_4XX_BYTES - 200))
    assert [send(headers, body), send(headers, body)] == [422, 422]
    (size,) = records(real_redis).values()
    assert DEFAULT_MAX_STORED_4XX_BYTES - 200 < size <= DEFAULT_MAX_STORED_4XX_BYTES + HEAD_BYTES
    real_redis.flushall()
    # 2xx keep max_stored_bytes; 0 keeps no 4xx body at all
    send = senders(framework, max_stored_4xx_bytes=0)
    for status in (422, 201):
        headers, body = stranger(status, blob="x" * 10_000)
        assert send(headers, body) == status
    sizes = sorted(records(real_redis).values())
    assert sizes[0] <= HEAD_BYTES < 10_000 < sizes[1]


@pytest.mark.parametrize("value", [-1, 1.5, True, "4096"])
def test_max_stored_4xx_bytes_is_a_whole_number_of_bytes(value: Any) -> None:
    with pytest.raises(ValueError, match="max_stored_4xx_bytes"):
        IdempotencyOptions(max_stored_4xx_bytes=value)
