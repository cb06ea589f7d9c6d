"""renew as an attacker would try it: the service under gunicorn on a real redis-server, and the SDK's
direct transport. Wrong, expired and settled leases are ``lease_lost`` and change nothing; bad input
is problem+json with a stable code; nothing is ever a 500 or extends a lease it should not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from tests.support.processes import Gunicorn, RedisServer, wait_until
from tests.support.service import AUTH, service_env
from token_service import defaults
from token_service.client import InvalidRequest, LeaseLost, TokenClient, TokenInvalid
from token_service.tokens import record_key

pytestmark = [pytest.mark.real, pytest.mark.slow]
SCOPE = "report.build"


@pytest.fixture(scope="module")
def service(redis_server: RedisServer) -> Iterator[str]:
    server = Gunicorn(service_env(redis_server.url), workers=1).start()
    yield server.url
    server.stop()


def call(url: str, path: str, body: Any = None, raw: str | bytes | None = None) -> httpx.Response:
    content = raw if raw is not None else json.dumps(body)
    headers = {**AUTH, "Content-Type": "application/json"}
    return httpx.post(url + path, content=content, headers=headers, timeout=30)


def begun(url: str, lease_seconds: int = 60) -> tuple[str, str]:
    token = call(url, "/token/generate", {"scope": SCOPE}).json()["token"]
    started = call(url, "/token/begin", {"token": token, "scope": SCOPE, "lease_seconds": lease_seconds})
    return token, started.json()["lease_id"]


def problem(answer: httpx.Response, status: int, code: str) -> None:
    assert answer.status_code == status, answer.text
    assert answer.headers["Content-Type"].startswith("application/problem+json")
    assert answer.json()["code"] == code


def test_leases_that_are_not_the_live_one_are_lost_and_unchanged(
    service: str, real_redis: redis.Redis
) -> None:
    token, lease_id = begun(service)
    record = record_key(defaults.KEY_PREFIX, token)
    before = real_redis.get(record)
    assert before is not None
    assert before.startswith(b"P")
    problem(call(service, "/token/renew", {"token": token, "lease_id": "guessed"}), 409, "lease_lost")
    problem(call(service, "/token/renew", {"token": token, "lease_id": lease_id + "x"}), 409, "lease_lost")
    assert real_redis.get(record) == before
    # a lease that ran out stays lost, even before anyone else took the token
    short, short_lease = begun(service, lease_seconds=1)
    wait_until(
        lambda: call(service, "/token/begin", {"token": short, "scope": SCOPE}).status_code == 200,
        what="the 1 s lease to run out",
    )
    problem(call(service, "/token/renew", {"token": short, "lease_id": short_lease}), 409, "lease_lost")
    # a settled token: completed, consumed, never begun
    assert (
        call(service, "/token/complete", {"token": token, "lease_id": lease_id, "result": 1}).status_code
        == 200
    )
    problem(call(service, "/token/renew", {"token": token, "lease_id": lease_id}), 409, "lease_lost")
    consumed = call(service, "/token/generate", {"scope": SCOPE}).json()["token"]
    assert call(service, "/token/consume", {"token": consumed, "scope": SCOPE}).status_code == 200
    problem(call(service, "/token/renew", {"token": consumed, "lease_id": lease_id}), 409, "lease_lost")
    issued = call(service, "/token/generate", {"scope": SCOPE}).json()["token"]
    problem(call(service, "/token/renew", {"token": issued, "lease_id": lease_id}), 409, "lease_lost")
    assert (
        call(service, "/token/consume", {"token": issued, "scope": SCOPE}).status_code == 200
    )  # still usable
    # unknown, revoked or malformed tokens
    problem(call(service, "/token/renew", {"token": "A" * 43, "lease_id": lease_id}), 404, "token_invalid")
    problem(
        call(service, "/token/renew", {"token": "A" * 10_000, "lease_id": lease_id}), 404, "token_invalid"
    )


@pytest.mark.parametrize(
    "lease_seconds",
    [0, -1, 3601, 10**30, 2**53 + 1, 5.5, True, "60", None, [60], {"s": 60}],
)
def test_lease_values_out_of_range_or_of_another_type_are_400(service: str, lease_seconds: Any) -> None:
    token, lease_id = begun(service)
    body = {"token": token, "lease_id": lease_id, "lease_seconds": lease_seconds}
    answer = call(service, "/token/renew", body)
    if lease_seconds is None:  # the documented "the service's default lease"
        assert answer.status_code == 200, answer.text
        return
    problem(answer, 400, "invalid_request")


@pytest.mark.parametrize(
    "raw",
    [
        "{",
        "[]",
        "null",
        '"renew"',
        '{"token": "%s", "lease_id": "%s", "lease_seconds": 1e400}',
        '{"token": "%s", "lease_id": "%s", "lease_seconds": NaN}',
        '{"token": "%s", "lease_id": "%s", "lease_seconds": ' + "9" * 5000 + "}",
        '{"token": "%s", "lease_id": "%s", "extra": 1}',
        '{"token": "%s", "lease_id": null}',
        '{"token": "%s", "lease_id": 5}',
        '{"token": "%s", "lease_id": "a\\u001fb"}',
        '{"token": "%s", "lease_id": "a\\u0000b"}',
        '{"token": "%s", "lease_id": "a\\ud800"}',
        '{"token": ["%s"], "lease_id": "%s"}',
        "[" * 100_000,
    ],
)
def test_bad_bodies_are_problem_json_never_500(service: str, raw: str) -> None:
    token, lease_id = begun(service)
    body = raw % ((token, lease_id)[: raw.count("%s")])
    answer = call(service, "/token/renew", raw=body)
    assert answer.status_code in (400, 413), answer.text
    problem(
        answer, answer.status_code, "invalid_request" if answer.status_code == 400 else "payload_too_large"
    )


def test_a_lease_id_too_long_for_the_body_limit_is_413(service: str) -> None:
    token, _ = begun(service)
    problem(
        call(service, "/token/renew", {"token": token, "lease_id": "x" * 100_000}), 413, "payload_too_large"
    )


def test_the_sdk_refuses_the_same_values_before_the_store(real_redis: redis.Redis) -> None:
    with TokenClient.from_redis(real_redis) as client:
        token = client.generate(SCOPE).token
        lease_id = client.begin(token, SCOPE, lease_seconds=60).lease_id  # type: ignore[union-attr]
        record = record_key(defaults.KEY_PREFIX, token)
        before = real_redis.get(record)
        for lease_seconds in (0, -1, 10**30, True, 1.5, "60"):
            with pytest.raises((InvalidRequest, TypeError, ValueError)):
                client.renew(token, lease_id, lease_seconds=lease_seconds)  # type: ignore[arg-type]
        for bad_id in ("", "a\x1fb", "x" * 10_000):
            with pytest.raises((InvalidRequest, LeaseLost)):
                client.renew(token, bad_id)
        assert real_redis.get(record) == before
        with pytest.raises(TokenInvalid):
            client.renew("A" * 43, lease_id)
