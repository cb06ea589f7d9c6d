"""Django: an ``async def`` view given ``client=AsyncTokenClient(...)`` and served over WSGI.

Under WSGI (gunicorn's sync workers, the test ``Client``) Django runs each request of an async view
on an event loop of its own, closed after it. A client made once, outside the request, keeps the
connections of the loop it first ran on: its second request reused one of a dead loop, answered a
500 and left its token PROCESSING until the lease ran out. The decorator refuses that second request
before the token is touched, naming the fixes (the settings' client, one per event loop; a client
made in the request; ASGI). A view given the other kind of client (a sync view an AsyncTokenClient, an
async one a TokenClient) is refused with a TypeError, its token untouched too. On a real redis-server."""

from __future__ import annotations

import gc
import logging
from typing import Any

import pytest
import redis
import redis.asyncio
from django.http import HttpRequest, JsonResponse
from django.test import AsyncClient as DjangoAsyncClient
from django.test import Client as DjangoClient
from django.test import RequestFactory, override_settings
from django.urls import clear_url_caches, path

from tests.integrations.test_require_token_parity import configure_django
from tests.support.processes import RedisServer
from token_service.client import AsyncTokenClient, TokenClient
from token_service.client.django import require_token

pytestmark = pytest.mark.real
SCOPE = "order.create"

urlpatterns: list[Any] = []  # this module is the Django URLconf; the test fills it in


def guarded_view(client: AsyncTokenClient, runs: list[int]) -> Any:
    async def view(request: HttpRequest) -> JsonResponse:
        runs.append(1)
        return JsonResponse({"run": len(runs)}, status=201)

    return require_token(SCOPE, client=client)(view)


@pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_second_request_on_another_event_loop_is_refused_before_its_token_is_touched(
    redis_server: RedisServer, real_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure_django()
    # Django's log record of the refusal would hold the client (through its traceback) past this test
    monkeypatch.setattr(logging.getLogger("django.request"), "disabled", True)
    runs: list[int] = []
    client = AsyncTokenClient.from_redis(redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port))
    urlpatterns[:] = [path("orders", guarded_view(client, runs))]
    with TokenClient.from_redis(real_redis) as tokens, override_settings(ROOT_URLCONF=__name__):
        first, second = (tokens.generate(SCOPE).token for _ in range(2))
        answer = DjangoClient().post("/orders", headers={"Idempotency-Token": first})
        assert answer.status_code == 201
        with pytest.raises(RuntimeError, match="serves the event loop it first served") as refused:
            DjangoClient().post("/orders", headers={"Idempotency-Token": second})
        assert tokens.inspect(second).state == "ISSUED"  # untouched: nothing to wait out
        assert runs == [1]
    # the connection of the first request's loop, closed since, can only be dropped: here, not in a later test
    del answer, client, refused
    urlpatterns.clear()
    clear_url_caches()
    gc.collect()


async def test_under_asgi_one_loop_serves_every_request(
    redis_server: RedisServer, real_redis: redis.Redis
) -> None:
    configure_django()
    runs: list[int] = []
    connection = redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port)
    client = AsyncTokenClient.from_redis(connection)
    urlpatterns[:] = [path("orders", guarded_view(client, runs))]
    try:
        with TokenClient.from_redis(real_redis) as tokens, override_settings(ROOT_URLCONF=__name__):
            for _ in range(3):
                token = tokens.generate(SCOPE).token
                answer = await DjangoAsyncClient().post("/orders", headers={"Idempotency-Token": token})
                assert answer.status_code == 201
        assert runs == [1, 1, 1]
    finally:
        await client.close()
        await connection.aclose()


async def test_a_view_given_the_other_kind_of_client_is_refused_before_its_token_is_touched(
    redis_server: RedisServer, real_redis: redis.Redis
) -> None:
    configure_django()
    runs: list[int] = []

    def sync_view(request: HttpRequest) -> JsonResponse:
        runs.append(1)
        return JsonResponse({}, status=201)

    async def async_view(request: HttpRequest) -> JsonResponse:
        return sync_view(request)

    connection = redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port)
    async_client = AsyncTokenClient.from_redis(connection)
    try:
        with TokenClient.from_redis(real_redis) as tokens:
            token = tokens.generate(SCOPE).token
            request = RequestFactory().post("/orders", headers={"Idempotency-Token": token})
            with pytest.raises(TypeError, match=r"^a sync view needs a TokenClient$"):
                require_token(SCOPE, client=async_client)(sync_view)(request)
            with pytest.raises(TypeError, match=r"^an async view needs an AsyncTokenClient$"):
                await require_token(SCOPE, client=tokens)(async_view)(request)
            assert tokens.inspect(token).state == "ISSUED"
        assert runs == []
    finally:
        await async_client.close()
        await connection.aclose()
