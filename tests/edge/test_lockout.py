"""The lockout scenario of the issuance limits, over HTTP (gunicorn) on a real redis-server.

A client fills its cap of outstanding tokens with 24 h tokens, then revokes
them (or, separately, consumes them, or begins them): it can generate again at
once, because a token stops counting toward the cap when it is used or revoked.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.processes import SERVERS, Gunicorn, RedisServer
from tests.support.service import AUTH, service_env

# slow: the service under gunicorn, filling and freeing a cap of tokens (~25 s)
pytestmark = pytest.mark.slow

SCOPE = "payment.create"
CAP = 100
DAY = 86400


@pytest.fixture(scope="module", params=sorted(SERVERS))
def service(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[Gunicorn]:
    env = service_env(
        redis_server.url,
        TOKEN_SERVICE_RATE_LIMIT="1000/minute",
        TOKEN_SERVICE_MAX_OUTSTANDING_PER_SUBJECT=str(CAP),
    )
    server = SERVERS[request.param](env, workers=1).start()
    yield server
    server.stop()


@pytest.fixture
def http(service: Gunicorn, redis_server: RedisServer) -> Iterator[httpx.Client]:
    redis_server.client().flushall()
    with httpx.Client(base_url=service.url, timeout=30) as client:
        yield client
    redis_server.client().flushall()  # the session's server: leave no full cap behind


def fill_the_cap(http: httpx.Client) -> list[str]:
    filled = http.post("/token/generate/batch", json={"scope": SCOPE, "ttl_seconds": DAY, "count": CAP})
    assert filled.status_code == 201, filled.text
    refused = http.post("/token/generate", json={"scope": SCOPE, "ttl_seconds": DAY})
    assert refused.status_code == 429
    assert refused.json()["code"] == "rate_limited"
    # a token counts at most an hour (and its bucket's rounding), whatever its TTL
    assert int(refused.headers["Retry-After"]) <= 3600 + 900
    return [entry["token"] for entry in filled.json()["tokens"]]


def generate_again(http: httpx.Client) -> None:
    again = http.post("/token/generate", json={"scope": SCOPE, "ttl_seconds": DAY})
    assert again.status_code == 201, again.text


@pytest.mark.real
def test_revoked_tokens_free_the_cap_at_once(http: httpx.Client) -> None:
    for token in fill_the_cap(http):
        assert http.post("/token/revoke", json={"token": token}, headers=AUTH).status_code == 200
    generate_again(http)


@pytest.mark.real
def test_consumed_tokens_free_the_cap_at_once(http: httpx.Client) -> None:
    for token in fill_the_cap(http):
        used = http.post("/token/consume", json={"token": token, "scope": SCOPE}, headers=AUTH)
        assert used.status_code == 200, used.text
    generate_again(http)


@pytest.mark.real
def test_begun_tokens_free_the_cap_at_once(http: httpx.Client) -> None:
    tokens = fill_the_cap(http)
    leases = []
    for token in tokens:
        started = http.post("/token/begin", json={"token": token, "scope": SCOPE}, headers=AUTH)
        assert started.status_code == 200, started.text
        leases.append(started.json()["lease_id"])
    generate_again(http)
    more = http.post("/token/generate/batch", json={"scope": SCOPE, "count": CAP - 1})
    assert more.status_code == 201
    assert http.post("/token/generate", json={"scope": SCOPE}).status_code == 429
    # a token released by a retryable failure, then consumed, frees nothing a second time
    failed = {"token": tokens[0], "lease_id": leases[0], "retryable": True}
    assert http.post("/token/fail", json=failed, headers=AUTH).json()["outcome"] == "released"
    used = http.post("/token/consume", json={"token": tokens[0], "scope": SCOPE}, headers=AUTH)
    assert used.status_code == 200
    assert http.post("/token/generate", json={"scope": SCOPE}).status_code == 429


@pytest.mark.real
def test_one_token_frees_one_slot(http: httpx.Client) -> None:
    tokens = fill_the_cap(http)
    assert http.post("/token/revoke", json={"token": tokens[0]}, headers=AUTH).status_code == 200
    generate_again(http)
    # the freed slot is taken again: the cap is full once more
    assert http.post("/token/generate", json={"scope": SCOPE}).status_code == 429
    # revoking a token twice, or consuming a revoked one, frees nothing more
    assert http.post("/token/revoke", json={"token": tokens[0]}, headers=AUTH).status_code == 404
    assert http.post("/token/generate", json={"scope": SCOPE}).status_code == 429
