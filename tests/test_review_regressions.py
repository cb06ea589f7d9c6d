"""Regressions for defects a review found: each failed (a 500, a write before validation) before its fix."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.conftest import AUTH
from tests.support.processes import RedisServer
from token_service import records
from token_service.config import RateLimit
from token_service.errors import InvalidRequest, ServiceUnavailable
from token_service.limits import IssuanceLimits
from token_service.store import IssueRequest, TokenStore, translate_errors

SCOPE = "payment.create"


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/token/generate", "subject"),
        ("/token/generate", "fingerprint"),
        ("/token/consume", "request_id"),
        ("/token/complete", "lease_id"),
    ],
)
def test_a_lone_surrogate_is_400_not_500(client: Any, path: str, field: str) -> None:
    body: dict[str, Any] = {"scope": SCOPE} if path == "/token/generate" else {"token": "A" * 43}
    if path == "/token/consume":
        body["scope"] = SCOPE
    body[field] = "ok\ud800"
    raw = json.dumps(body)  # ensure_ascii writes the surrogate as the escape \ud800
    response = client.post(path, data=raw, headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 400, response.data
    assert field in response.json["errors"]


def test_results_nested_near_the_recursion_limit_are_never_500(client: Any) -> None:
    token = client.post("/token/generate", json={"scope": SCOPE}).json["token"]
    client.post("/token/begin", json={"token": token, "scope": SCOPE}, headers=AUTH)
    seen = set()
    for depth in [*range(60, 70), *range(900, 1100)]:  # around the cap, and around Python's limit
        # the wrong lease makes every storable result a 409 from the store, and nothing is stored
        nested = "[" * depth + "]" * depth
        raw = f'{{"token": "{token}", "lease_id": "not-the-lease", "result": {nested}}}'
        response = client.post(
            "/token/complete", data=raw, headers={**AUTH, "Content-Type": "application/json"}
        )
        assert response.status_code in (400, 409), (depth, response.data)
        seen.add(response.status_code)
    assert seen == {400, 409}  # the range spans both sides of the limit


@pytest.mark.parametrize("value", [float("nan"), float("inf"), object()])
def test_payloads_that_cannot_be_stored_are_invalid_requests(value: Any) -> None:
    with pytest.raises(InvalidRequest):
        records.check_payload("result", value, 1000)


def test_a_refused_issue_argument_charges_no_limit(redis_client: Any) -> None:
    store = TokenStore(redis_client)
    limits = IssuanceLimits(RateLimit(3, 60), max_outstanding=10)
    for _ in range(4):
        with pytest.raises(InvalidRequest):
            store.admit_and_issue("ts:c:x", limits, IssueRequest(SCOPE, "al\x1fice", None, 60))
    assert redis_client.hgetall("ts:c:x") == {}
    assert len(store.admit_and_issue("ts:c:x", limits, IssueRequest(SCOPE, "alice", None, 60), 3)) == 3


@pytest.mark.parametrize("bad_ttl", ["1e3", "0x10", "inf", "5.0", " 5", "-5", "0", "1" * 16])
def test_scripts_take_only_plain_decimal_integers(redis_client: Any, bad_ttl: str) -> None:
    store = TokenStore(redis_client)
    reply = store._call("issue", [store.key("B" * 43)], [SCOPE, "", "", bad_ttl])
    assert records.text(reply[0]) == "invalid_argument"
    assert redis_client.dbsize() == 0


def test_a_busy_redis_is_503() -> None:
    with pytest.raises(ServiceUnavailable), translate_errors():
        raise redis.exceptions.ResponseError("BUSY Redis is busy running a script.")


@pytest.fixture
def impatient_redis() -> Iterator[RedisServer]:
    server = RedisServer("--busy-reply-threshold", "50").start()
    yield server
    server.stop()


@pytest.mark.real
def test_a_script_hogging_redis_gives_503_then_service_resumes(impatient_redis: RedisServer) -> None:
    from token_service import create_app

    app = create_app({"redis_url": impatient_redis.url, "api_keys": "k" * 20, "rate_limit": "off"})
    client = app.test_client()
    hog = threading.Thread(
        target=lambda: _run_quietly(impatient_redis.client(), "local i = 0 while true do i = i + 1 end")
    )
    hog.start()
    time.sleep(0.3)  # past the busy threshold: Redis now answers BUSY to everyone else
    try:
        busy = client.post("/token/generate", json={"scope": SCOPE})
        assert busy.status_code == 503, busy.data
        assert busy.json["code"] == "store_unavailable"
    finally:
        impatient_redis.client().script_kill()
        hog.join(timeout=10)
    assert client.post("/token/generate", json={"scope": SCOPE}).status_code == 201


def _run_quietly(connection: redis.Redis, script: str) -> None:
    with contextlib.suppress(redis.exceptions.ResponseError):  # SCRIPT KILL ends it, as intended
        connection.eval(script, 0)
