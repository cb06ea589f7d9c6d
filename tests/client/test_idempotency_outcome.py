"""The Idempotency-Key middlewares when Redis goes away as the response is stored.

The middleware's Redis is a real redis-server behind tests/support/tcp_proxy.py,
with redis-py's own retries off (``Retry(NoBackoff(), 0)``): the middleware's rule
is what is tested, the guards' one (``_renewal.settle_pause``), not whatever
redis-py does by itself. The app cuts Redis off as it answers, so the fault bites
while the response is stored (just before its last bytes go out):

- for a second: the client gets the response, a repeat its replay
  (``Idempotent-Replayed: true``), the app ran once (before, the store gave up,
  the key stayed claimed and a repeat after the claim ran the app again);
- for longer than the claim: the response is broken off before its end (never a
  success whose outcome was not kept; Django's middleware, which stores before
  it answers, answers 500 ``outcome_not_recorded``), the app ran once; to the
  key it is a crashed holder: a repeat after the claim runs the app again.
"""

from __future__ import annotations

import json
import secrets
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry
from werkzeug.test import Client

from tests.client.test_outcome_blips import BLIP_SECONDS, SOCKET_TIMEOUT_SECONDS, Blip
from tests.support.processes import RedisServer, wait_until
from tests.support.tcp_proxy import FaultProxy, Mode
from token_service.client import OutcomeNotRecorded
from token_service.client.asgi import IdempotencyMiddleware as AsgiIdempotencyMiddleware
from token_service.client.wsgi import IdempotencyMiddleware

pytestmark = [pytest.mark.real, pytest.mark.slow]
LOCK_SECONDS = 3


@pytest.fixture
def headers() -> dict[str, str]:
    """A key of each test's own (every test's client is the same one)."""
    return {"Idempotency-Key": f"order-{secrets.token_hex(6)}", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def proxy(redis_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(("127.0.0.1", redis_server.port)) as fault_proxy:
        yield fault_proxy


@pytest.fixture
def connection(proxy: FaultProxy, real_redis: redis.Redis) -> Iterator[redis.Redis]:
    proxy.set_mode(Mode.PASS)
    through = redis.Redis(
        host="127.0.0.1",
        port=proxy.port,
        socket_timeout=SOCKET_TIMEOUT_SECONDS,
        socket_connect_timeout=SOCKET_TIMEOUT_SECONDS,
        retry=Retry(NoBackoff(), 0),
    )
    yield through
    through.close()
    proxy.set_mode(Mode.PASS)


def fault_for(proxy: FaultProxy, seconds: float | None, request: pytest.FixtureRequest) -> Blip:
    fault = Blip(proxy, Mode.REFUSE, seconds)
    request.addfinalizer(fault.close)
    return fault


def wsgi_app(connection: redis.Redis, fault: Blip, runs: Counter[str]) -> Client:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        runs["order"] += 1
        body = json.dumps({"order": runs["order"]}).encode()
        start_response(
            "201 Created", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        )
        if runs["order"] == 1:
            fault.start()  # Redis goes away as the response is stored
        return [body]

    middleware = IdempotencyMiddleware(
        app, connection, identity=lambda environ: "client-1", lock_seconds=LOCK_SECONDS
    )
    return Client(middleware)


def test_wsgi_a_blip_as_the_response_is_stored_changes_nothing(
    connection: redis.Redis, headers: dict[str, str], proxy: FaultProxy, request: pytest.FixtureRequest
) -> None:
    runs: Counter[str] = Counter()
    fault = fault_for(proxy, BLIP_SECONDS, request)
    client = wsgi_app(connection, fault, runs)
    first = client.post("/orders", headers=headers, data="{}")
    assert (first.status_code, first.get_json()) == (201, {"order": 1})
    assert fault.healed.is_set()
    again = client.post("/orders", headers=headers, data="{}")
    assert (again.status_code, again.get_json()) == (201, {"order": 1})
    assert again.headers["Idempotent-Replayed"] == "true"
    assert runs["order"] == 1


def test_wsgi_an_outage_longer_than_the_claim_breaks_the_response_off(
    connection: redis.Redis, headers: dict[str, str], proxy: FaultProxy, request: pytest.FixtureRequest
) -> None:
    runs: Counter[str] = Counter()
    fault = fault_for(proxy, None, request)
    client = wsgi_app(connection, fault, runs)
    with pytest.raises(OutcomeNotRecorded) as caught:  # the server aborts it: it never ends well
        client.post("/orders", headers=headers, data="{}").get_data()
    assert caught.value.result == {"status": 201}
    assert caught.value.token_ref in str(caught.value)
    fault.heal()
    assert runs["order"] == 1
    # a crashed holder's key: once its claim runs out a repeat runs the app again
    wait_until(
        lambda: client.post("/orders", headers=headers, data="{}").status_code == 201,
        30,
        0.2,
        "the claim to run out",
    )
    assert runs["order"] == 2


@pytest.mark.parametrize("seconds", [BLIP_SECONDS, None], ids=["blip", "longer-than-the-claim"])
async def test_asgi_rides_a_blip_and_breaks_the_response_off_past_the_claim(
    proxy: FaultProxy, headers: dict[str, str], seconds: float | None, request: pytest.FixtureRequest
) -> None:
    runs: Counter[str] = Counter()
    fault = fault_for(proxy, seconds, request)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        runs["order"] += 1
        body = json.dumps({"order": runs["order"]}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 201,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        fault.start()
        await send({"type": "http.response.body", "body": body})

    connection = redis.asyncio.Redis(
        host="127.0.0.1",
        port=proxy.port,
        socket_timeout=SOCKET_TIMEOUT_SECONDS,
        socket_connect_timeout=SOCKET_TIMEOUT_SECONDS,
        retry=AsyncRetry(NoBackoff(), 0),
    )
    middleware = AsgiIdempotencyMiddleware(
        app, connection, identity=lambda scope: "client-1", lock_seconds=LOCK_SECONDS
    )
    transport = httpx.ASGITransport(app=middleware)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            if seconds is None:
                with pytest.raises(OutcomeNotRecorded):
                    await client.post("/orders", headers=headers, content="{}")
            else:
                first = await client.post("/orders", headers=headers, content="{}")
                assert (first.status_code, first.json()) == (201, {"order": 1})
                again = await client.post("/orders", headers=headers, content="{}")
                assert (again.status_code, again.json()) == (201, {"order": 1})
                assert again.headers["Idempotent-Replayed"] == "true"
    finally:
        fault.heal()
        await connection.aclose()
    assert runs["order"] == 1


@pytest.mark.parametrize("seconds", [BLIP_SECONDS, None], ids=["blip", "longer-than-the-claim"])
def test_django_rides_a_blip_and_answers_outcome_not_recorded_past_the_claim(
    connection: redis.Redis,
    proxy: FaultProxy,
    headers: dict[str, str],
    seconds: float | None,
    request: pytest.FixtureRequest,
) -> None:
    from django.http import HttpRequest, JsonResponse
    from django.test import RequestFactory, override_settings

    from tests.integrations.test_require_token_parity import configure_django
    from token_service.client.django import IdempotencyKeyMiddleware

    configure_django()
    runs: Counter[str] = Counter()
    fault = fault_for(proxy, seconds, request)

    def view(http_request: HttpRequest) -> JsonResponse:
        runs["order"] += 1
        fault.start()  # Redis goes away as the response is stored
        return JsonResponse({"order": runs["order"]}, status=201)

    options = {"LOCK_SECONDS": LOCK_SECONDS, "IDENTITY": lambda http_request: "client-1"}
    with override_settings(TOKEN_SERVICE={"REDIS_URL": connection, "IDEMPOTENCY_KEY": options}):
        middleware = IdempotencyKeyMiddleware(view)

    def post() -> Any:
        return middleware(
            RequestFactory().post(
                "/orders",
                data="{}",
                content_type="application/json",
                headers={"Idempotency-Key": headers["Idempotency-Key"]},
            )
        )

    first = post()
    if seconds is None:
        assert first.status_code == 500
        document = json.loads(first.content)
        assert document["code"] == "outcome_not_recorded"
        assert b'"order"' not in first.content  # the response that was not kept does not go out
    else:
        assert (first.status_code, json.loads(first.content)) == (201, {"order": 1})
        again = post()
        assert (again.status_code, json.loads(again.content)) == (201, {"order": 1})
        assert again["Idempotent-Replayed"] == "true"
    fault.heal()
    assert runs["order"] == 1
