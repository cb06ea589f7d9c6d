"""``@require_token`` when Redis goes away as the view's response is stored (Flask, FastAPI, Django).

The token client reaches a real redis-server through tests/support/tcp_proxy.py;
the view cuts it off just before it returns, so the fault bites while the
response is stored:

- for a second: the client gets the view's response, a duplicate its replay, the
  view ran once (before, the store gave up after about 0.45 s, the response went
  out all the same and the token stayed PROCESSING: after the lease a duplicate
  ran the view again);
- for longer than the lease: never the success: a 500 problem+json with code
  ``outcome_not_recorded`` and the record's ``token_ref`` (no lease id, no
  response); a streamed body is broken off before its end. To the token it is a
  crashed holder: after the lease a duplicate runs the view again, as the
  integration pages say.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio
from django.http import HttpRequest, JsonResponse
from django.test import Client as DjangoClient
from django.test import override_settings
from django.urls import path
from fastapi import FastAPI
from flask import Flask, Response
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.client.test_outcome_blips import BLIP_SECONDS, SOCKET_TIMEOUT_SECONDS, Blip
from tests.integrations.test_require_token_parity import configure_django
from tests.support.processes import RedisServer, wait_until
from tests.support.tcp_proxy import FaultProxy, Mode
from token_service.client import AsyncTokenClient, OutcomeNotRecorded, TokenClient
from token_service.client.django import require_token as django_require_token
from token_service.client.fastapi import require_token as fastapi_require_token
from token_service.client.flask import require_token as flask_require_token
from token_service.tokens import token_digest

pytestmark = [pytest.mark.real, pytest.mark.slow]
SCOPE = "payment.create"
LEASE_SECONDS = 3
urlpatterns: list[Any] = []  # this module is the Django URLconf of its test


@pytest.fixture(scope="module")
def proxy(redis_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(("127.0.0.1", redis_server.port)) as fault_proxy:
        yield fault_proxy


def through(proxy: FaultProxy) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1",
        port=proxy.port,
        socket_timeout=SOCKET_TIMEOUT_SECONDS,
        socket_connect_timeout=SOCKET_TIMEOUT_SECONDS,
        retry=Retry(NoBackoff(), 0),  # the SDK's retries are what is tested, not redis-py's
    )


@pytest.fixture
def tokens(proxy: FaultProxy) -> Iterator[TokenClient]:
    proxy.set_mode(Mode.PASS)
    connection = through(proxy)
    with TokenClient.from_redis(connection) as client:
        yield client
    connection.close()
    proxy.set_mode(Mode.PASS)


@pytest.fixture
def issuer(real_redis: redis.Redis) -> Iterator[TokenClient]:
    with TokenClient.from_redis(real_redis) as client:
        yield client


def fault_for(proxy: FaultProxy, seconds: float | None, request: pytest.FixtureRequest) -> Blip:
    fault = Blip(proxy, Mode.REFUSE, seconds)
    request.addfinalizer(fault.close)
    return fault


def assert_not_recorded(status: int, headers: Any, body: bytes, token: str) -> None:
    assert status == 500
    assert headers["content-type"] == "application/problem+json"
    document = json.loads(body)
    assert document["code"] == "outcome_not_recorded"
    assert document["token_ref"] == token_digest(token)
    assert "lease" not in document  # the lease id fences the record: never handed to the client
    assert "charged" not in body.decode()  # the response that was not kept does not go out


def flask_app(tokens: TokenClient, fault: Blip, runs: Counter[str]) -> Flask:
    app = Flask("outcome")

    @app.post("/pay")
    @flask_require_token(tokens, SCOPE, lease_seconds=LEASE_SECONDS)
    def pay() -> Any:
        runs["pay"] += 1
        fault.start()  # Redis goes away as the response is stored
        return {"charged": 100}, 201

    @app.post("/stream")
    @flask_require_token(tokens, SCOPE, lease_seconds=LEASE_SECONDS)
    def stream() -> Any:
        runs["stream"] += 1

        def chunks() -> Iterator[bytes]:
            yield b"charged "
            fault.start()  # the outcome is stored when the last byte is handed on
            yield b"100\n"

        return Response(chunks(), content_type="text/plain")

    return app


def test_flask_a_blip_as_the_response_is_stored_changes_nothing(
    tokens: TokenClient, issuer: TokenClient, proxy: FaultProxy, request: pytest.FixtureRequest
) -> None:
    runs: Counter[str] = Counter()
    fault = fault_for(proxy, BLIP_SECONDS, request)
    client = flask_app(tokens, fault, runs).test_client()
    token = issuer.generate(SCOPE).token
    first = client.post("/pay", headers={"Idempotency-Token": token})
    assert (first.status_code, first.get_json()) == (201, {"charged": 100})
    assert fault.healed.is_set()
    again = client.post("/pay", headers={"Idempotency-Token": token})
    assert (again.status_code, again.get_json()) == (201, {"charged": 100})
    assert again.headers["Idempotent-Replayed"] == "true"
    assert runs["pay"] == 1


def test_flask_never_answers_success_for_a_response_it_could_not_keep(
    tokens: TokenClient, issuer: TokenClient, proxy: FaultProxy, request: pytest.FixtureRequest
) -> None:
    runs: Counter[str] = Counter()
    fault = fault_for(proxy, None, request)
    client = flask_app(tokens, fault, runs).test_client()
    token = issuer.generate(SCOPE).token
    answer = client.post("/pay", headers={"Idempotency-Token": token})
    assert_not_recorded(answer.status_code, answer.headers, answer.data, token)
    fault.heal()
    assert runs["pay"] == 1
    # a crashed holder's token: after its lease a duplicate runs the view again (the docs say so)
    wait_until(
        lambda: client.post("/pay", headers={"Idempotency-Token": token}).status_code != 409,
        30,
        0.2,
        "the lease to run out",
    )
    assert runs["pay"] == 2


def test_flask_a_stream_whose_outcome_is_not_recorded_is_broken_off(
    tokens: TokenClient, issuer: TokenClient, proxy: FaultProxy, request: pytest.FixtureRequest
) -> None:
    runs: Counter[str] = Counter()
    fault = fault_for(proxy, None, request)
    client = flask_app(tokens, fault, runs).test_client()
    token = issuer.generate(SCOPE).token
    with pytest.raises(OutcomeNotRecorded):  # the server aborts the response: it never ends well
        client.post("/stream", headers={"Idempotency-Token": token}).get_data()
    assert runs["stream"] == 1


# -- FastAPI and Django: the same flow (client/_require_token_core.py), one case each -----------


def fastapi_app(tokens: AsyncTokenClient, fault: Blip, runs: Counter[str]) -> FastAPI:
    app = FastAPI()

    @app.post("/pay", status_code=201)
    @fastapi_require_token(tokens, SCOPE, lease_seconds=LEASE_SECONDS)
    async def pay() -> dict[str, int]:
        runs["pay"] += 1
        fault.start()
        return {"charged": 100}

    return app


@pytest.mark.parametrize("seconds", [BLIP_SECONDS, None], ids=["blip", "longer-than-the-lease"])
async def test_fastapi_rides_a_blip_and_never_answers_success_past_the_lease(
    proxy: FaultProxy,
    issuer: TokenClient,
    seconds: float | None,
    request: pytest.FixtureRequest,
) -> None:
    runs: Counter[str] = Counter()
    fault = fault_for(proxy, seconds, request)
    connection = redis.asyncio.Redis(
        host="127.0.0.1",
        port=proxy.port,
        socket_timeout=SOCKET_TIMEOUT_SECONDS,
        socket_connect_timeout=SOCKET_TIMEOUT_SECONDS,
        retry=AsyncRetry(NoBackoff(), 0),
    )
    tokens = AsyncTokenClient.from_redis(connection)
    transport = httpx.ASGITransport(app=fastapi_app(tokens, fault, runs))
    token = issuer.generate(SCOPE).token
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            answer = await client.post("/pay", headers={"Idempotency-Token": token})
            if seconds is None:
                assert_not_recorded(answer.status_code, answer.headers, answer.content, token)
            else:
                assert (answer.status_code, answer.json()) == (201, {"charged": 100})
                again = await client.post("/pay", headers={"Idempotency-Token": token})
                assert (again.status_code, again.json()) == (201, {"charged": 100})
                assert again.headers["Idempotent-Replayed"] == "true"
    finally:
        fault.heal()
        await connection.aclose()
    assert runs["pay"] == 1


def test_django_never_answers_success_for_a_response_it_could_not_keep(
    tokens: TokenClient, issuer: TokenClient, proxy: FaultProxy, request: pytest.FixtureRequest
) -> None:
    configure_django()
    runs: Counter[str] = Counter()
    fault = fault_for(proxy, None, request)

    @django_require_token(SCOPE, client=tokens, lease_seconds=LEASE_SECONDS)
    def pay(http_request: HttpRequest) -> JsonResponse:
        runs["pay"] += 1
        fault.start()
        return JsonResponse({"charged": 100}, status=201)

    urlpatterns[:] = [path("pay", pay)]
    token = issuer.generate(SCOPE).token
    with override_settings(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["testserver"]):
        answer = DjangoClient(raise_request_exception=False).post(
            "/pay", headers={"Idempotency-Token": token}
        )
    assert_not_recorded(answer.status_code, answer, answer.content, token)
    assert runs["pay"] == 1
