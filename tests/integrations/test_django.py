"""Django: @require_token (sync, async, DRF) and the Idempotency-Key middleware,
under gunicorn (WSGI) and under uvicorn (Django's ASGI handler), on a real redis-server."""

from __future__ import annotations

import concurrent.futures
import json
import sys
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from tests.integrations.servers import AppServer
from tests.support.cut_short import post_cut_short
from tests.support.processes import RedisServer, wait_until
from token_service.client import TokenClient
from token_service.client._fingerprint import fields_fingerprint

pytestmark = [pytest.mark.real, pytest.mark.slow]
PAYMENT = {"amount": 1250, "currency": "EUR"}
PAYMENT_PRINT = fields_fingerprint(PAYMENT)
SETTINGS = "tests.integrations.django_project.settings"


def django_server(kind: str, redis_server: RedisServer, **env: str) -> AppServer:
    """The test project under gunicorn (WSGI: the sync middleware) or uvicorn (ASGI: the async one)."""
    env = {"TS_TEST_REDIS_URL": redis_server.url, "DJANGO_SETTINGS_MODULE": SETTINGS, **env}
    if kind == "gunicorn":
        app = "tests.integrations.django_project.wsgi:application"
        return AppServer.gunicorn(app, env, "--config", "python:tests.integrations.gunicorn_django")
    return AppServer.uvicorn("tests.integrations.django_project.asgi:application", env)


@pytest.fixture(scope="module", params=["gunicorn", "uvicorn"])
def server(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[AppServer]:
    started = django_server(request.param, redis_server)
    yield started.start()
    started.stop()


@pytest.fixture
def tokens(real_redis: redis.Redis) -> Iterator[TokenClient]:
    with TokenClient.from_redis(real_redis) as client:
        yield client


def runs(real_redis: redis.Redis, name: str) -> int:
    return int(real_redis.get(f"runs:{name}") or 0)


def post(server: AppServer, path: str, body: Any = None, **headers: str) -> httpx.Response:
    sent = {name.replace("_", "-"): value for name, value in headers.items()}
    return httpx.post(server.url + path, json=body, headers=sent, timeout=60)


def concurrently(count: int, call: Any) -> list[httpx.Response]:
    barrier = threading.Barrier(count)

    def send(_: int) -> httpx.Response:
        barrier.wait()
        result: httpx.Response = call()
        return result

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(send, range(count)))


def problem(answer: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["Content-Type"].startswith("application/problem+json")
    body: dict[str, Any] = answer.json()
    assert body["code"] == code
    return body


# -- @require_token ------------------------------------------------------------------------------


def test_a_duplicate_gets_the_first_response(server: AppServer, tokens: TokenClient, real_redis: Any) -> None:
    token = tokens.generate("payment.create", subject="alice", fingerprint=PAYMENT_PRINT).token
    first = post(server, "/pay", PAYMENT, Idempotency_Token=token, X_User_Id="alice")
    assert first.status_code == 201, first.text
    assert first.json() == {"id": "pay_1", **PAYMENT}
    again = post(server, "/pay", PAYMENT, Idempotency_Token=token, X_User_Id="alice")
    assert (again.status_code, again.content) == (201, first.content)
    assert again.headers["Location"] == "/payments/pay_1"
    assert again.headers["Content-Type"] == "application/json"
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "X-Not-Replayed" not in again.headers
    assert runs(real_redis, "pay") == 1


@pytest.mark.parametrize("path", ["/pay-waiting", "/pay-async"])
def test_concurrent_duplicates_run_once_and_get_the_same_response(
    server: AppServer, tokens: TokenClient, real_redis: Any, path: str
) -> None:
    token = tokens.generate("payment.create", subject="alice").token
    answers = concurrently(8, lambda: post(server, path, PAYMENT, Idempotency_Token=token, X_User_Id="alice"))
    assert [answer.status_code for answer in answers] == [201] * 8
    assert len({answer.content for answer in answers}) == 1
    assert sum(answer.headers.get("Idempotent-Replayed") == "true" for answer in answers) == 7
    assert runs(real_redis, path.strip("/").replace("-", "_")) == 1


def test_drf_view(server: AppServer, tokens: TokenClient, real_redis: Any) -> None:
    token = tokens.generate("drf.payment").token
    first = post(server, "/drf/payments", {}, Idempotency_Token=token)
    again = post(server, "/drf/payments", {}, Idempotency_Token=token)
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json() == {"id": "pay_1"}
    assert again.headers["Idempotent-Replayed"] == "true"
    assert runs(real_redis, "drf") == 1


def test_the_error_table(server: AppServer, tokens: TokenClient, real_redis: Any) -> None:
    body = problem(post(server, "/pay", PAYMENT, X_User_Id="alice"), 400, "invalid_request")
    assert "Idempotency-Token" in body["errors"]
    problem(post(server, "/pay", PAYMENT, Idempotency_Token="A" * 43), 404, "token_invalid")
    problem(post(server, "/pay", PAYMENT, Idempotency_Token="not a token!"), 404, "token_invalid")
    token = tokens.generate("payment.create", subject="alice", fingerprint=PAYMENT_PRINT).token
    problem(
        post(server, "/pay", PAYMENT, Idempotency_Token=token, X_User_Id="mallory"), 403, "token_mismatch"
    )
    other = {"amount": 1, "currency": "EUR"}
    problem(post(server, "/pay", other, Idempotency_Token=token, X_User_Id="alice"), 403, "token_mismatch")
    assert runs(real_redis, "pay") == 0
    used = tokens.generate("payment.create", subject="alice", fingerprint=PAYMENT_PRINT).token
    tokens.consume(used, "payment.create", subject="alice", fingerprint=PAYMENT_PRINT)
    problem(post(server, "/pay", PAYMENT, Idempotency_Token=used, X_User_Id="alice"), 409, "token_used")
    held = tokens.generate("payment.create", subject="alice", fingerprint=PAYMENT_PRINT).token
    tokens.begin(held, "payment.create", subject="alice", fingerprint=PAYMENT_PRINT, lease_seconds=60)
    busy = post(server, "/pay", PAYMENT, Idempotency_Token=held, X_User_Id="alice")
    problem(busy, 409, "token_in_progress")
    assert int(busy.headers["Retry-After"]) >= 1
    token = tokens.generate("declined.op").token
    assert post(server, "/declined", Idempotency_Token=token).status_code == 500
    failed = problem(post(server, "/declined", Idempotency_Token=token), 409, "token_failed")
    assert failed["error"] == {"type": "Declined", "message": "card declined"}
    assert runs(real_redis, "declined") == 1
    token = tokens.generate("crash.op").token
    assert post(server, "/crash", Idempotency_Token=token).status_code == 500  # frees the token
    assert post(server, "/crash", Idempotency_Token=token).json() == {"run": 2}


def test_a_body_cut_short_leaves_the_token_unused(
    server: AppServer, tokens: TokenClient, real_redis: Any
) -> None:
    # gunicorn ends the body at the client's FIN and Django hands the view the part that came:
    # the view ran on 10 of 40 bytes and used the token up (ASGI: Django drops the request)
    token = tokens.generate("payment.create", subject="alice").token
    head = {"Idempotency-Token": token, "X-User-Id": "alice", "Content-Type": "application/json"}
    body = json.dumps({"amount": 1250, "note": "0123456789"}).encode()
    before = runs(real_redis, "pay_waiting")
    status, _, content = post_cut_short(server.url, "/pay-waiting", head, body[:10], len(body))
    if "gunicorn" in server.command:
        assert status == 400, content
        assert json.loads(content)["errors"] == {"body": ["Incomplete."]}
    else:
        assert status in (None, 400), content
    assert tokens.inspect(token).state == "ISSUED"
    assert runs(real_redis, "pay_waiting") == before
    retry = httpx.post(server.url + "/pay-waiting", content=body, headers=head, timeout=60)
    assert retry.status_code == 201, retry.text
    assert "Idempotent-Replayed" not in retry.headers
    assert runs(real_redis, "pay_waiting") == before + 1


def test_a_body_nested_to_the_recursion_limit_is_refused_not_a_500(
    server: AppServer, tokens: TokenClient, real_redis: Any
) -> None:
    # fingerprint=["amount", "currency"]: at ~3 depths near the limit the field parsed but could
    # not be encoded again, and the decorator answered 500. Every depth around it: 403 mismatch.
    token = tokens.generate("payment.create", subject="alice", fingerprint=PAYMENT_PRINT).token
    head = {"Idempotency-Token": token, "X-User-Id": "alice", "Content-Type": "application/json"}
    statuses = set()
    with httpx.Client(timeout=60) as client:
        for depth in range(850, 1001):
            body = b'{"amount":' + b"[" * depth + b"]" * depth + b',"currency":"EUR"}'
            statuses.add(client.post(server.url + "/pay", content=body, headers=head).status_code)
    assert statuses == {403}
    assert runs(real_redis, "pay") == 0
    assert tokens.inspect(token).state == "ISSUED"


# -- the Idempotency-Key middleware --------------------------------------------------------------


@pytest.mark.parametrize("path", ["/api/orders", "/api/orders-async"])
def test_middleware_runs_a_key_once_and_replays_it(server: AppServer, real_redis: Any, path: str) -> None:
    key = f'"{path}-{server.port}"'
    answers = concurrently(
        8, lambda: post(server, path, {"sku": "A1"}, Idempotency_Key=key, Authorization="Bearer alice")
    )
    assert [answer.status_code for answer in answers] == [201] * 8
    assert len({answer.content for answer in answers}) == 1
    assert sum(answer.headers.get("Idempotent-Replayed") == "true" for answer in answers) == 7
    # another client's same key is another request
    bob = post(server, path, {"sku": "A1"}, Idempotency_Key=key, Authorization="Bearer bob")
    assert bob.status_code == 201
    assert "Idempotent-Replayed" not in bob.headers
    assert runs(real_redis, path.removeprefix("/api/").replace("-", "_")) == 2


def test_middleware_error_table(server: AppServer, real_redis: Any) -> None:
    alice = "Bearer alice"
    key = f'"errors-{server.port}"'
    problem(post(server, "/api/orders", {"sku": "A1"}, Authorization=alice), 400, "invalid_request")
    problem(
        post(server, "/api/orders", {}, Idempotency_Key="k" * 300, Authorization=alice),
        400,
        "invalid_request",
    )
    problem(post(server, "/api/orders", {}, Idempotency_Key=key), 400, "idempotency_identity_required")
    assert (
        post(server, "/api/orders", {"sku": "A1"}, Idempotency_Key=key, Authorization=alice).status_code
        == 201
    )
    # the same key, the same body in another key order: a replay; another body: 422
    again = post(server, "/api/orders", {"sku": "A1"}, Idempotency_Key=key, Authorization=alice)
    assert again.headers["Idempotent-Replayed"] == "true"
    other = post(server, "/api/orders", {"sku": "B2"}, Idempotency_Key=key, Authorization=alice)
    problem(other, 422, "idempotency_key_mismatch")
    # a 5xx is not stored: the retry runs
    key = f'"flaky-{server.port}"'
    assert post(server, "/api/orders-503", {}, Idempotency_Key=key, Authorization=alice).status_code == 503
    retry = post(server, "/api/orders-503", {}, Idempotency_Key=key, Authorization=alice)
    assert retry.status_code == 201
    assert "Idempotent-Replayed" not in retry.headers
    # a path outside PATHS is not guarded at all
    assert httpx.get(server.url + "/healthz", timeout=30).status_code == 200


def test_middleware_refuses_two_idempotency_key_fields(server: AppServer, real_redis: Any) -> None:
    # the server joins them ("A,B"): neither key is chosen, nor a third one (issue 26)
    before = runs(real_redis, "orders")
    for fields in (['"two-a"', '"two-b"'], ["two-a", "two-b"], ["two-a, two-b"]):
        headers = [("Authorization", "Bearer alice"), *(("Idempotency-Key", field) for field in fields)]
        answer = httpx.post(server.url + "/api/orders", json={"sku": "A1"}, headers=headers, timeout=60)
        problem(answer, 400, "idempotency_key_repeated")
    assert runs(real_redis, "orders") == before


@pytest.mark.parametrize("kind", ["gunicorn", "uvicorn"])
def test_middleware_without_waiting_a_duplicate_gets_409_and_an_exception_frees_the_key(
    kind: str, redis_server: RedisServer, real_redis: Any
) -> None:
    started = django_server(kind, redis_server, TS_TEST_IK_WAIT_SECONDS="0").start()
    try:
        alice = {"Idempotency_Key": '"slow"', "Authorization": "Bearer alice"}
        first: list[httpx.Response] = []
        # 5 s: the duplicate must land while the first still runs, however slowly this process sees it start
        thread = threading.Thread(
            target=lambda: first.append(post(started, "/api/orders", {"sleep": 5}, **alice))
        )
        thread.start()
        wait_until(lambda: runs(real_redis, "orders") == 1, 30, what="the first request to start")
        busy = post(started, "/api/orders", {"sleep": 5}, **alice)
        thread.join(60)
        body = problem(busy, 409, "idempotency_key_in_use")
        assert 1 <= int(busy.headers["Retry-After"]) <= 10  # LOCK_SECONDS
        assert body["retry_after_seconds"] == int(busy.headers["Retry-After"])
        assert first[0].status_code == 201
        again = post(started, "/api/orders", {"sleep": 5}, **alice)
        assert (again.content, again.headers["Idempotent-Replayed"]) == (first[0].content, "true")
        assert runs(real_redis, "orders") == 1
        # a view that raises: Django answers 500, nothing is stored, the retry runs
        crash = {"Idempotency_Key": '"crash"', "Authorization": "Bearer alice"}
        assert post(started, "/api/orders-crash", {}, **crash).status_code == 500
        retry = post(started, "/api/orders-crash", {}, **crash)
        assert (retry.status_code, retry.json()) == (201, {"run": 2})
        assert "Idempotent-Replayed" not in retry.headers
        assert post(started, "/api/orders-crash", {}, **crash).headers["Idempotent-Replayed"] == "true"
    finally:
        started.stop()


@pytest.mark.parametrize("kind", ["gunicorn", "uvicorn"])
def test_the_middleware_and_the_decorator_with_their_store_down_fail_closed_with_503(
    kind: str, redis_server: RedisServer, real_redis: Any
) -> None:
    # one server for both: the middleware's own store and the settings' token clients are dead
    # port 1: nothing listens there, whereas a port free_port() found free may be bound by another
    # xdist worker's redis-server by the time the view connects (a live store: 404, not 503)
    dead = "redis://127.0.0.1:1/0"
    started = django_server(kind, redis_server, TS_TEST_IK_REDIS_URL=dead, TS_TEST_TOKENS_REDIS_URL=dead)
    started.start()
    try:
        down = post(
            started, "/api/orders", {"sku": "A1"}, Idempotency_Key='"k"', Authorization="Bearer alice"
        )
        problem(down, 503, "store_unavailable")
        assert int(down.headers["Retry-After"]) >= 1
        assert runs(real_redis, "orders") == 0  # the view never ran unguarded
        # an async view on the settings' client, one per event loop: under gunicorn (2 workers) each
        # request has a loop of its own, and 3 requests give one worker a second loop
        for _ in range(3):
            down = post(started, "/store-down", Idempotency_Token="A" * 43)
            problem(down, 503, "store_unavailable")
            assert int(down.headers["Retry-After"]) >= 1
        assert runs(real_redis, "down") == 0
    finally:
        started.stop()


def test_middleware_a_body_cut_short_runs_nothing(server: AppServer, real_redis: Any) -> None:
    head = {
        "Idempotency-Key": f'"cut-short-{server.port}"',
        "Authorization": "Bearer alice",
        "Content-Type": "application/json",
    }
    body = json.dumps({"sku": "A1", "note": "0123456789"}).encode()
    before = runs(real_redis, "orders")
    status, headers, content = post_cut_short(server.url, "/api/orders", head, body[:10], len(body))
    if "gunicorn" in server.command:
        assert status == 400, content
        assert headers["content-type"].startswith("application/problem+json")
        assert json.loads(content)["code"] == "invalid_request"
    else:  # Django's ASGI handler drops a request whose client left: no answer
        assert status in (None, 400), content
    retry = httpx.post(server.url + "/api/orders", content=body, headers=head, timeout=60)
    assert retry.status_code == 201, retry.text  # not 422 idempotency_key_mismatch
    assert retry.json()["body"] == {"sku": "A1", "note": "0123456789"}
    assert runs(real_redis, "orders") == before + 1


def test_the_example_runs_with_one_command(redis_server: RedisServer) -> None:
    example = AppServer(
        [sys.executable, "-m", "examples.django_app"],
        {"TOKEN_SERVICE_REDIS_URL": redis_server.url, "PORT": "{port}"},
    )
    example.health_path = "/payments/list"
    example.start()
    try:
        headers = {"X-User-Id": "ada"}
        token = httpx.post(
            example.url + "/checkout/token", json={"amount": 5}, headers=headers, timeout=30
        ).json()["token"]
        headers["Idempotency-Token"] = token
        clicks = concurrently(
            2, lambda: httpx.post(example.url + "/payments", json={"amount": 5}, headers=headers, timeout=30)
        )
        assert [click.status_code for click in clicks] == [201, 201]
        assert clicks[0].json() == clicks[1].json()
        assert len(httpx.get(example.url + "/payments/list", timeout=30).json()["charges"]) == 1
        api = {"Idempotency-Key": '"order-1"', "Authorization": "Bearer ada"}
        posts = [
            httpx.post(example.url + "/api/orders", json={"sku": "A1"}, headers=api, timeout=30)
            for _ in range(2)
        ]
        assert posts[0].json() == posts[1].json() == {"id": "o_1", "sku": "A1"}
        assert posts[1].headers["Idempotent-Replayed"] == "true"
        assert len(httpx.get(example.url + "/api/orders", timeout=30).json()["orders"]) == 1
    finally:
        example.stop()
