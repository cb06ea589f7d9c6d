"""FastAPI's require_token on uvicorn and a real redis-server: replays, concurrency, the error table."""

from __future__ import annotations

import concurrent.futures
import sys
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from tests.integrations.servers import AppServer
from tests.support.processes import RedisServer
from token_service.client import TokenClient
from token_service.client._fingerprint import fields_fingerprint

pytestmark = [pytest.mark.real, pytest.mark.slow]
PAYMENT = {"amount": 1250, "currency": "EUR"}
PAYMENT_PRINT = fields_fingerprint(PAYMENT)


@pytest.fixture(scope="module")
def server(redis_server: RedisServer) -> Iterator[AppServer]:
    started = AppServer.uvicorn("tests.integrations.fastapi_app:app", {"TS_TEST_REDIS_URL": redis_server.url})
    yield started.start()
    started.stop()


@pytest.fixture
def tokens(real_redis: redis.Redis) -> Iterator[TokenClient]:
    with TokenClient.from_redis(real_redis) as client:
        yield client


def runs(real_redis: redis.Redis, name: str) -> int:
    return int(real_redis.get(f"runs:{name}") or 0)


def post(
    server: AppServer, path: str, token: str | None, body: Any = None, user: str = "alice"
) -> httpx.Response:
    headers = {"X-User-Id": user}
    if token is not None:
        headers["Idempotency-Token"] = token
    return httpx.post(server.url + path, json=body, headers=headers, timeout=60)


def test_a_duplicate_gets_the_first_response_and_the_endpoint_runs_once(
    server: AppServer, tokens: TokenClient, real_redis: redis.Redis
) -> None:
    token = tokens.generate("payment.create", subject="alice", fingerprint=PAYMENT_PRINT).token
    first = post(server, "/payments", token, PAYMENT)
    assert first.status_code == 201, first.text
    assert first.json() == {"id": "pay_1", "amount": 1250, "currency": "EUR"}
    assert first.headers["Location"] == "/payments/pay_1"
    assert "Idempotent-Replayed" not in first.headers
    for _ in range(2):
        again = post(server, "/payments", token, {"currency": "EUR", "amount": 1250})  # key order: same
        assert again.status_code == 201
        assert again.content == first.content
        assert again.headers["Location"] == "/payments/pay_1"
        assert again.headers["Content-Type"] == "application/json"
        assert again.headers["Idempotent-Replayed"] == "true"
        assert "X-Not-Replayed" not in again.headers  # only the chosen headers are kept
    assert runs(real_redis, "payments") == 1


def test_concurrent_duplicates_run_once_and_every_caller_gets_the_same_response(
    server: AppServer, tokens: TokenClient, real_redis: redis.Redis
) -> None:
    token = tokens.generate("payment.create", subject="alice").token
    barrier = threading.Barrier(8)

    def send(_: int) -> httpx.Response:
        barrier.wait()
        return post(server, "/payments/waiting", token, PAYMENT)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(send, range(8)))
    assert [answer.status_code for answer in answers] == [201] * 8
    assert {answer.content for answer in answers} == {b'{"id":"pay_1","amount":1250}'}
    assert sum(answer.headers.get("Idempotent-Replayed") == "true" for answer in answers) == 7
    assert runs(real_redis, "waiting") == 1


def test_concurrent_duplicates_without_waiting_get_409_in_progress(
    server: AppServer, tokens: TokenClient, real_redis: redis.Redis
) -> None:
    token = tokens.generate("payment.create", subject="alice", fingerprint=PAYMENT_PRINT).token
    barrier = threading.Barrier(6)

    def send(_: int) -> httpx.Response:
        barrier.wait()
        return post(server, "/payments", token, PAYMENT)

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(send, range(6)))
    fresh = [a for a in answers if a.status_code == 201 and "Idempotent-Replayed" not in a.headers]
    assert len(fresh) == 1
    for answer in answers:
        if answer.status_code == 409:
            assert answer.json()["code"] == "token_in_progress"
            assert int(answer.headers["Retry-After"]) >= 1
        else:
            assert answer.content == fresh[0].content
    assert runs(real_redis, "payments") == 1


def test_sync_endpoints_and_returned_responses(
    server: AppServer, tokens: TokenClient, real_redis: redis.Redis
) -> None:
    token = tokens.generate("sync.op").token
    assert post(server, "/sync", token).json() == post(server, "/sync", token).json() == {"run": 1}
    token = tokens.generate("raw.op").token
    first, again = post(server, "/raw", token), post(server, "/raw", token)
    assert first.status_code == again.status_code == 202
    assert first.content == again.content == b'{"run":1}'
    assert again.headers["X-Order"] == "o-1"
    assert again.headers["Content-Type"] == "application/json"
    assert "X-Other" not in again.headers
    assert again.headers["Idempotent-Replayed"] == "true"
    assert runs(real_redis, "raw") == 1


def test_a_stored_4xx_is_replayed_a_5xx_or_an_exception_frees_the_token(
    server: AppServer, tokens: TokenClient, real_redis: redis.Redis
) -> None:
    token = tokens.generate("missing.op").token
    first, again = post(server, "/missing", token), post(server, "/missing", token)
    assert first.status_code == again.status_code == 404
    assert again.json() == {"detail": "no such order"}
    assert again.headers["Idempotent-Replayed"] == "true"
    assert runs(real_redis, "missing") == 1

    token = tokens.generate("unavailable.op").token
    assert post(server, "/unavailable", token).status_code == 503
    assert post(server, "/unavailable", token).json() == {"run": 2}  # the retry ran
    assert post(server, "/unavailable", token).json() == {"run": 2}  # then it was stored

    token = tokens.generate("crash.op").token
    assert post(server, "/crash", token).status_code == 500
    assert post(server, "/crash", token).json() == {"run": 2}


def test_a_streamed_response_is_recorded_as_it_goes_out_and_replayed(
    server: AppServer, tokens: TokenClient, real_redis: redis.Redis
) -> None:
    token = tokens.generate("stream.op").token
    first, again = post(server, "/stream", token), post(server, "/stream", token)
    assert (first.status_code, first.content) == (200, b"ab")
    assert (again.status_code, again.content) == (200, b"ab")  # under the caps: byte for byte
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Body-Omitted" not in again.headers
    assert again.headers["Content-Type"].startswith("text/plain")
    assert runs(real_redis, "stream") == 1


def test_too_large_a_response_is_kept_without_its_body(
    server: AppServer, tokens: TokenClient, real_redis: redis.Redis
) -> None:
    token = tokens.generate("big.op").token
    first, again = post(server, "/big", token), post(server, "/big", token)
    assert first.status_code == again.status_code == 200
    assert len(first.content) > 5000
    assert again.content == b""
    assert again.headers["Idempotent-Body-Omitted"] == str(len(first.content))
    assert runs(real_redis, "big") == 1


def problem(answer: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["Content-Type"].startswith("application/problem+json")
    body: dict[str, Any] = answer.json()
    assert body["code"] == code
    return body


def test_the_error_table(server: AppServer, tokens: TokenClient, real_redis: redis.Redis) -> None:
    # missing header: 400, and the endpoint never runs
    body = problem(post(server, "/payments", None, PAYMENT), 400, "invalid_request")
    assert "Idempotency-Token" in body["errors"]
    # unknown, malformed (never reaches Redis)
    problem(post(server, "/payments", "A" * 43, PAYMENT), 404, "token_invalid")
    problem(post(server, "/payments", "not a token!", PAYMENT), 404, "token_invalid")
    # another user's token, another payment's token: 403, and the token stays usable
    token = tokens.generate("payment.create", subject="alice", fingerprint=PAYMENT_PRINT).token
    assert problem(post(server, "/payments", token, PAYMENT, user="mallory"), 403, "token_mismatch")
    other = {"amount": 999999, "currency": "EUR"}
    problem(post(server, "/payments", token, other), 403, "token_mismatch")
    # a body FastAPI refuses (422) never reaches the guard: the token is not used
    assert post(server, "/payments", token, {"amount": "lots"}).status_code == 422
    assert runs(real_redis, "payments") == 0
    assert post(server, "/payments", token, PAYMENT).status_code == 201
    # a token used by a one-shot consume: 409 token_used
    used = tokens.generate("payment.create", subject="alice", fingerprint=PAYMENT_PRINT).token
    tokens.consume(used, "payment.create", subject="alice", fingerprint=PAYMENT_PRINT)
    problem(post(server, "/payments", used, PAYMENT), 409, "token_used")
    # a terminal failure: the first gets the error (500), duplicates 409 token_failed
    token = tokens.generate("declined.op").token
    assert post(server, "/declined", token).status_code == 500
    failed = problem(post(server, "/declined", token), 409, "token_failed")
    assert failed["error"] == {"type": "Declined", "message": "card declined"}
    assert runs(real_redis, "declined") == 1
    # a live holder: 409 token_in_progress with Retry-After (covered concurrently above)
    # the store down: 503 with Retry-After, fail closed (the endpoint never runs)
    down = post(server, "/store-down", "A" * 43)
    problem(down, 503, "store_unavailable")
    assert int(down.headers["Retry-After"]) >= 1
    assert runs(real_redis, "down") == 0


def test_the_example_charges_a_double_click_once(redis_server: RedisServer, real_redis: redis.Redis) -> None:
    example = AppServer(
        [sys.executable, "-m", "examples.fastapi_app"],
        {"TOKEN_SERVICE_REDIS_URL": redis_server.url, "PORT": "{port}"},
    )
    example.start()
    try:
        headers = {"X-User-Id": "ada"}
        token = httpx.post(example.url + "/checkout/token", json=PAYMENT, headers=headers, timeout=30).json()[
            "token"
        ]
        headers["Idempotency-Token"] = token

        def click(_: int) -> httpx.Response:
            return httpx.post(example.url + "/payments", json=PAYMENT, headers=headers, timeout=30)

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            clicks = list(pool.map(click, range(2)))
        assert [click.status_code for click in clicks] == [201, 201]
        assert clicks[0].json() == clicks[1].json()
        assert len(httpx.get(example.url + "/payments", timeout=30).json()["charges"]) == 1
    finally:
        example.stop()
