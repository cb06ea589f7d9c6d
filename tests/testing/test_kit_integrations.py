"""The integrations pointed at the kit's store through their own options, no production code changed:
the Idempotency-Key middlewares given ``token_store.redis()`` / ``async_redis()``, FastAPI's
``require_token`` given a dependency a test overrides. (Flask, Django, Celery and ``@idempotent``
are the page's examples: tests/testing/test_kit_docs.py runs them.)"""

from __future__ import annotations

import itertools
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from flask import Flask

from token_service.client import AsyncTokenClient
from token_service.client import asgi as asgi_middleware
from token_service.client.fastapi import require_token
from token_service.client.wsgi import IdempotencyMiddleware
from token_service.testing import InMemoryStore, StoreClock, StoreFaults

AUTH = {"Authorization": "Bearer ada"}


def _flask_orders(store: InMemoryStore) -> Flask:
    app = Flask(__name__)
    numbers = itertools.count(1)

    @app.post("/orders")
    def order() -> tuple[dict[str, int], int]:
        return {"order": next(numbers)}, 201

    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, store.redis(), ttl_seconds=600)  # type: ignore[method-assign]
    return app


def test_the_wsgi_middleware_replays_until_the_stored_response_expires(
    token_store: InMemoryStore, token_clock: StoreClock
) -> None:
    http = _flask_orders(token_store).test_client()
    first = http.post("/orders", headers={**AUTH, "Idempotency-Key": "k-1"})
    again = http.post("/orders", headers={**AUTH, "Idempotency-Key": "k-1"})
    assert first.json == again.json == {"order": 1}
    assert again.headers["Idempotent-Replayed"] == "true"
    token_clock.advance(601)
    assert http.post("/orders", headers={**AUTH, "Idempotency-Key": "k-1"}).json == {"order": 2}


def test_the_wsgi_middleware_answers_503_while_the_store_is_down(
    token_store: InMemoryStore, token_faults: StoreFaults
) -> None:
    http = _flask_orders(token_store).test_client()
    with token_faults.store_down():
        answer = http.post("/orders", headers={**AUTH, "Idempotency-Key": "k-1"})
    assert answer.status_code == 503
    assert answer.json is not None
    assert answer.json["code"] == "store_unavailable"
    assert http.post("/orders", headers={**AUTH, "Idempotency-Key": "k-1"}).json == {"order": 1}


async def test_the_asgi_middleware_on_the_async_store(
    token_store: InMemoryStore, token_clock: StoreClock
) -> None:
    numbers = itertools.count(1)

    async def orders(scope: Any, receive: Any, send: Any) -> None:
        body = b'{"order": %d}' % next(numbers)
        await send(
            {
                "type": "http.response.start",
                "status": 201,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    app = asgi_middleware.IdempotencyMiddleware(orders, token_store.async_redis(), ttl_seconds=60)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://shop") as http:
        first = await http.post("/orders", headers={**AUTH, "Idempotency-Key": "k"}, json={})
        again = await http.post("/orders", headers={**AUTH, "Idempotency-Key": "k"}, json={})
        assert first.json() == again.json() == {"order": 1}
        token_clock.advance(61)
        later = await http.post("/orders", headers={**AUTH, "Idempotency-Key": "k"}, json={})
        assert later.json() == {"order": 2}


def _fastapi_payments(dependency: Any) -> FastAPI:
    app = FastAPI()
    numbers = itertools.count(1)

    @app.post("/payments", status_code=201)
    @require_token(dependency, "payment.create")
    async def pay() -> dict[str, int]:
        return {"payment": next(numbers)}

    return app


def production_tokens() -> AsyncTokenClient:
    raise AssertionError("a test overrides this dependency: production's client is never built here")


async def test_fastapi_takes_its_client_from_an_overridable_dependency(
    async_token_client: AsyncTokenClient,
) -> None:
    app = _fastapi_payments(production_tokens)
    app.dependency_overrides[production_tokens] = lambda: async_token_client
    token = (await async_token_client.generate("payment.create")).token
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://shop") as http:
        first = await http.post("/payments", headers={"Idempotency-Token": token})
        again = await http.post("/payments", headers={"Idempotency-Token": token})
    assert first.json() == again.json() == {"payment": 1}
    assert again.headers["Idempotent-Replayed"] == "true"


async def test_fastapi_refuses_a_dependency_that_returns_no_client() -> None:
    app = _fastapi_payments(lambda: "redis://somewhere")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://shop") as http:
        with pytest.raises(TypeError, match="returned str, not an AsyncTokenClient"):
            await http.post("/payments", headers={"Idempotency-Token": "t"})


def test_fastapi_refuses_what_is_neither_a_client_nor_a_dependency() -> None:
    with pytest.raises(TypeError, match="AsyncTokenClient, or a dependency returning one"):
        require_token("redis://somewhere", "payment.create")  # type: ignore[arg-type]


DJANGO_SCRIPT = """
import django
from django.conf import settings
from django.http import JsonResponse
from django.test import Client, override_settings
from django.urls import path

settings.configure(
    ALLOWED_HOSTS=["testserver"],
    ROOT_URLCONF=__name__,
    TOKEN_SERVICE={"REDIS_URL": "redis://127.0.0.1:1/0"},  # production's, unreachable here
)
django.setup()

from token_service.client.django import require_token
from token_service.testing import InMemoryStore


@require_token("payment.create")
def pay(request):
    return JsonResponse({"paid": True}, status=201)


urlpatterns = [path("pay", pay)]
store = InMemoryStore()
token = store.client().generate("payment.create").token
before = Client().post("/pay", headers={"Idempotency-Token": token}).status_code
with override_settings(TOKEN_SERVICE={"REDIS_URL": store.redis()}):
    during = Client().post("/pay", headers={"Idempotency-Token": token}).status_code
print(before, during)
"""


def test_django_views_follow_an_override_of_the_settings_after_a_first_request(tmp_path: Any) -> None:
    # the views' client is made from settings.TOKEN_SERVICE once per process; a test that points
    # them at its own store after a request was served must reach that store, not the first one
    import subprocess
    import sys

    script = tmp_path / "django_override.py"
    script.write_text(DJANGO_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["503", "201"]
