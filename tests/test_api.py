"""The HTTP contract (openapi.yaml), route by route and row by row of the error table
(docs/http-api.md)."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.support.service import API_KEY, AUTH
from token_service import create_app

SCOPE = "payment.create"
RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\Z")


def generate(client: Any, **body: Any) -> dict[str, Any]:
    response = client.post("/token/generate", json={"scope": SCOPE, **body})
    assert response.status_code == 201, response.json
    return response.json  # type: ignore[no-any-return]


def post(client: Any, path: str, body: Any, headers: dict[str, str] | None = None) -> Any:
    return client.post(path, json=body, headers=AUTH if headers is None else headers)


def assert_problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.data
    assert response.mimetype == "application/problem+json"
    body = response.json
    assert body["code"] == code
    assert body["status"] == status
    assert body["type"].endswith("/" + code)
    assert body["title"]
    assert body["detail"]
    return body  # type: ignore[no-any-return]


# --- happy paths -------------------------------------------------------------


def test_generate_returns_a_bound_token_that_is_never_cached(client: Any) -> None:
    before = datetime.now(UTC)
    response = client.post(
        "/token/generate",
        json={"scope": SCOPE, "subject": "user-1", "ttl_seconds": 120, "fingerprint": "order-7"},
    )
    assert response.status_code == 201
    assert response.headers["Cache-Control"] == "no-store"
    body = response.json
    assert set(body) == {"token", "scope", "subject", "fingerprint", "ttl_seconds", "expires_at"}
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", body["token"])  # 256 bits
    assert (body["scope"], body["subject"], body["fingerprint"], body["ttl_seconds"]) == (
        SCOPE,
        "user-1",
        "order-7",
        120,
    )
    assert RFC3339_UTC.match(body["expires_at"])
    expires = datetime.fromisoformat(body["expires_at"].replace("Z", "+00:00"))
    assert before + timedelta(seconds=118) <= expires <= before + timedelta(seconds=122)


def test_generate_defaults(client: Any) -> None:
    body = generate(client)
    assert (body["subject"], body["fingerprint"], body["ttl_seconds"]) == (None, None, 300)


def test_batch_issues_count_tokens(client: Any, redis_client: Any) -> None:
    response = client.post("/token/generate/batch", json={"scope": SCOPE, "count": 1000, "subject": "u"})
    assert response.status_code == 201
    tokens = response.json["tokens"]
    assert len({t["token"] for t in tokens}) == 1000
    assert all(t["subject"] == "u" and t["scope"] == SCOPE for t in tokens)
    assert redis_client.dbsize() == 1000


def test_consume_then_duplicate_then_retry_of_the_winner(client: Any) -> None:
    token = generate(client, subject="user-1")["token"]
    body = {"token": token, "scope": SCOPE, "subject": "user-1", "request_id": "req-1"}
    first = post(client, "/token/consume", body)
    assert (first.status_code, first.json) == (200, {"outcome": "consumed", "replayed": False})
    retry = post(client, "/token/consume", body)
    assert (retry.status_code, retry.json) == (200, {"outcome": "consumed", "replayed": True})
    duplicate = post(client, "/token/consume", {**body, "request_id": "req-2"})
    assert_problem(duplicate, 409, "token_used")


def test_two_phase_flow_and_replay_of_the_stored_result(client: Any) -> None:
    token = generate(client)["token"]
    started = post(client, "/token/begin", {"token": token, "scope": SCOPE, "lease_seconds": 10})
    assert started.status_code == 200
    assert started.json["outcome"] == "started"
    assert started.json["replayed"] is False
    assert RFC3339_UTC.match(started.json["lease_expires_at"])
    lease_id = started.json["lease_id"]

    busy = post(client, "/token/begin", {"token": token, "scope": SCOPE})
    body = assert_problem(busy, 409, "token_in_progress")
    assert 1 <= int(busy.headers["Retry-After"]) <= 10
    assert body["retry_after_seconds"] == int(busy.headers["Retry-After"])

    inspected = post(client, "/token/inspect", {"token": token}).json
    assert inspected["state"] == "PROCESSING"
    assert RFC3339_UTC.match(inspected["lease_expires_at"])

    result = {"charge": "ch_1", "amount": 990, "items": [1, 2, None], "ok": True}
    done = post(client, "/token/complete", {"token": token, "lease_id": lease_id, "result": result})
    assert (done.status_code, done.json) == (200, {"outcome": "succeeded", "replayed": False})

    duplicate = post(client, "/token/begin", {"token": token, "scope": SCOPE})
    assert (duplicate.status_code, duplicate.json) == (
        200,
        {"outcome": "succeeded", "replayed": True, "result": result},
    )
    inspected = post(client, "/token/inspect", {"token": token}).json
    assert inspected["state"] == "SUCCEEDED"
    assert inspected["result"] == result
    assert_problem(post(client, "/token/consume", {"token": token, "scope": SCOPE}), 409, "token_used")


def test_fail_retryable_then_terminal(client: Any) -> None:
    token = generate(client)["token"]
    lease = post(client, "/token/begin", {"token": token, "scope": SCOPE}).json["lease_id"]
    released = post(client, "/token/fail", {"token": token, "lease_id": lease, "retryable": True})
    assert (released.status_code, released.json) == (200, {"outcome": "released", "replayed": False})
    assert post(client, "/token/inspect", {"token": token}).json["state"] == "ISSUED"

    lease = post(client, "/token/begin", {"token": token, "scope": SCOPE}).json["lease_id"]
    error = {"reason": "card_declined"}
    failed = post(
        client, "/token/fail", {"token": token, "lease_id": lease, "retryable": False, "error": error}
    )
    assert (failed.status_code, failed.json) == (200, {"outcome": "failed", "replayed": False})
    duplicate = post(client, "/token/begin", {"token": token, "scope": SCOPE})
    assert assert_problem(duplicate, 409, "token_failed")["error"] == error
    assert post(client, "/token/inspect", {"token": token}).json["error"] == error


def test_inspect_changes_nothing_and_revoke_removes(client: Any, redis_client: Any) -> None:
    token = generate(client, subject="s")["token"]
    snapshot = {key: redis_client.get(key) for key in redis_client.keys("*")}
    for _ in range(3):
        inspected = post(client, "/token/inspect", {"token": token})
        assert inspected.status_code == 200
        assert inspected.json["state"] == "ISSUED"
        assert inspected.json["subject"] == "s"
    assert {key: redis_client.get(key) for key in redis_client.keys("*")} == snapshot
    revoked = post(client, "/token/revoke", {"token": token})
    assert (revoked.status_code, revoked.json) == (200, {"outcome": "revoked"})
    assert redis_client.dbsize() == 0
    assert_problem(post(client, "/token/inspect", {"token": token}), 404, "token_invalid")


# --- the error table -----------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/token/generate", {}, "scope"),
        ("/token/generate", {"scope": ""}, "scope"),
        ("/token/generate", {"scope": "-starts-with-dash"}, "scope"),
        ("/token/generate", {"scope": "x" * 65}, "scope"),
        ("/token/generate", {"scope": "has space"}, "scope"),
        ("/token/generate", {"scope": 7}, "scope"),
        ("/token/generate", {"scope": SCOPE, "ttl_seconds": "60"}, "ttl_seconds"),
        ("/token/generate", {"scope": SCOPE, "ttl_seconds": 1.5}, "ttl_seconds"),
        ("/token/generate", {"scope": SCOPE, "ttl_seconds": True}, "ttl_seconds"),
        ("/token/generate", {"scope": SCOPE, "ttl_seconds": 0}, "ttl_seconds"),
        ("/token/generate", {"scope": SCOPE, "ttl_seconds": 86401}, "ttl_seconds"),
        ("/token/generate", {"scope": SCOPE, "subject": "x" * 129}, "subject"),
        ("/token/generate", {"scope": SCOPE, "subject": "tab\there"}, "subject"),
        ("/token/generate", {"scope": SCOPE, "fingerprint": ["a"]}, "fingerprint"),
        ("/token/generate", {"scope": SCOPE, "admin": True}, "admin"),
        ("/token/generate/batch", {"scope": SCOPE}, "count"),
        ("/token/generate/batch", {"scope": SCOPE, "count": 1001}, "count"),
        ("/token/generate/batch", {"scope": SCOPE, "count": 0}, "count"),
        ("/token/consume", {"scope": SCOPE}, "token"),
        ("/token/consume", {"token": 12345, "scope": SCOPE}, "token"),
        ("/token/consume", {"token": "abc", "scope": SCOPE, "extra": 1}, "extra"),
        ("/token/consume", {"token": "abc", "scope": SCOPE, "request_id": ""}, "request_id"),
        ("/token/begin", {"token": "abc", "scope": SCOPE, "lease_seconds": 3601}, "lease_seconds"),
        ("/token/begin", {"token": "abc", "scope": SCOPE, "lease_seconds": -1}, "lease_seconds"),
        ("/token/complete", {"token": "abc"}, "lease_id"),
        ("/token/fail", {"token": "abc", "lease_id": "l"}, "retryable"),
        ("/token/fail", {"token": "abc", "lease_id": "l", "retryable": 1}, "retryable"),
        ("/token/fail", {"token": "abc", "lease_id": "l", "retryable": "false"}, "retryable"),
        ("/token/inspect", {}, "token"),
        ("/token/revoke", {"token": None}, "token"),
    ],
)
def test_schema_violations_are_400_with_per_field_errors(
    client: Any, path: str, body: Any, field: str
) -> None:
    problem = assert_problem(post(client, path, body), 400, "invalid_request")
    assert field in problem["errors"], problem


@pytest.mark.parametrize(
    ("path", "body", "fields"),
    [
        ("/token/generate", {"scope": "bad scope", "ttl_seconds": 0}, {"scope", "ttl_seconds"}),
        ("/token/generate", {"ttl_seconds": 86401, "subject": ""}, {"scope", "ttl_seconds", "subject"}),
        (
            "/token/generate/batch",
            {"scope": "bad scope", "ttl_seconds": -1, "count": 0},
            {"scope", "ttl_seconds", "count"},
        ),
        (
            "/token/begin",
            {"token": "abc", "scope": "bad scope", "lease_seconds": 0},
            {"scope", "lease_seconds"},
        ),
        (
            "/token/renew",
            {"token": 5, "lease_id": "", "lease_seconds": 0},
            {"token", "lease_id", "lease_seconds"},
        ),
    ],
)
def test_every_bad_field_of_a_body_is_reported_at_once(
    client: Any, path: str, body: Any, fields: set[str]
) -> None:
    # the configured limits (ttl_seconds, lease_seconds) were checked only once every other
    # field was right: a bad scope and a bad ttl reported the scope alone
    problem = assert_problem(post(client, path, body), 400, "invalid_request")
    assert set(problem["errors"]) == fields, problem


@pytest.mark.parametrize("path", ["/token/generate", "/token/consume", "/token/complete"])
@pytest.mark.parametrize(
    ("data", "content_type"),
    [
        (b'{"scope": ', "application/json"),
        (b"\xff\xfe\x00garbage", "application/json"),
        (b'["a", "list"]', "application/json"),
        (b'"a string"', "application/json"),
        (b"null", "application/json"),
        (b"scope=payment.create", "application/x-www-form-urlencoded"),
        (b'{"scope": "payment.create"}', "text/plain"),
        (b"", "application/json"),
    ],
)
def test_bodies_that_are_not_a_json_object_are_400(
    client: Any, path: str, data: bytes, content_type: str
) -> None:
    response = client.post(path, data=data, headers={**AUTH, "Content-Type": content_type})
    assert_problem(response, 400, "invalid_request")


@pytest.mark.parametrize("path", ["/token/generate", "/token/consume"])
def test_huge_bodies_are_413(client: Any, path: str) -> None:
    body = json.dumps({"scope": SCOPE, "subject": "x" * 100_000}).encode()
    response = client.post(path, data=body, headers={**AUTH, "Content-Type": "application/json"})
    assert_problem(response, 413, "payload_too_large")


def test_a_result_over_the_cap_is_refused_and_the_lease_survives(client: Any) -> None:
    token = generate(client)["token"]
    lease = post(client, "/token/begin", {"token": token, "scope": SCOPE}).json["lease_id"]
    too_big = post(client, "/token/complete", {"token": token, "lease_id": lease, "result": "x" * 20_000})
    assert "result" in assert_problem(too_big, 400, "invalid_request")["errors"]
    ok = post(client, "/token/complete", {"token": token, "lease_id": lease, "result": "fits"})
    assert ok.status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-key-wrong-key-wrong"},
        {"Authorization": f"Basic {API_KEY}"},
        {"Authorization": "Bearer "},
        {"Authorization": API_KEY},
    ],
)
@pytest.mark.parametrize("path", ["/token/consume", "/token/begin", "/token/inspect", "/token/revoke"])
def test_backend_routes_need_the_service_key(client: Any, path: str, headers: dict[str, str]) -> None:
    token = generate(client)["token"]
    response = post(client, path, {"token": token, "scope": SCOPE}, headers=headers)
    assert_problem(response, 401, "unauthorized")
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert post(client, "/token/inspect", {"token": token}).json["state"] == "ISSUED"


def test_keys_may_be_configured_as_sha256_digests(redis_client: Any) -> None:
    digest = hashlib.sha256(b"a-key-kept-only-as-a-digest").hexdigest()
    app = create_app({"api_keys": f"sha256:{digest}", "redis_client": redis_client, "rate_limit": "off"})
    client = app.test_client()
    token = generate(client)["token"]
    ok = post(
        client, "/token/inspect", {"token": token}, {"Authorization": "Bearer a-key-kept-only-as-a-digest"}
    )
    assert ok.status_code == 200
    denied = post(client, "/token/inspect", {"token": token}, {"Authorization": f"Bearer {digest}"})
    assert_problem(denied, 401, "unauthorized")


def test_frontend_routes_need_no_key(client: Any) -> None:
    assert client.post("/token/generate", json={"scope": SCOPE}).status_code == 201


@pytest.mark.parametrize(
    "bad_token", ["", "short", "has spaces in it......", "x" * 129, "ä" * 30, "a/b" * 10]
)
def test_malformed_tokens_are_404_token_invalid(client: Any, bad_token: str) -> None:
    assert_problem(post(client, "/token/consume", {"token": bad_token, "scope": SCOPE}), 404, "token_invalid")


def test_unknown_and_revoked_tokens_are_404(client: Any) -> None:
    unknown = "A" * 43
    assert_problem(post(client, "/token/consume", {"token": unknown, "scope": SCOPE}), 404, "token_invalid")
    token = generate(client)["token"]
    post(client, "/token/revoke", {"token": token})
    for path in ("/token/consume", "/token/begin"):
        assert_problem(post(client, path, {"token": token, "scope": SCOPE}), 404, "token_invalid")
    for path in ("/token/inspect", "/token/revoke"):
        assert_problem(post(client, path, {"token": token}), 404, "token_invalid")


def test_mismatch_is_403_and_does_not_use_the_token(client: Any) -> None:
    token = generate(client, subject="alice", fingerprint="order-1")["token"]
    for wrong in ({"scope": "payment.refund"}, {"subject": "mallory"}, {"fingerprint": "order-2"}):
        body = {"token": token, "scope": SCOPE, "subject": "alice", "fingerprint": "order-1", **wrong}
        problem = assert_problem(post(client, "/token/consume", body), 403, "token_mismatch")
        assert problem["field"] == next(iter(wrong))
    right = {"token": token, "scope": SCOPE, "subject": "alice", "fingerprint": "order-1"}
    assert post(client, "/token/consume", right).status_code == 200


def test_lease_lost_for_a_wrong_lease(client: Any) -> None:
    token = generate(client)["token"]
    post(client, "/token/begin", {"token": token, "scope": SCOPE})
    for path, extra in (("/token/complete", {"result": 1}), ("/token/fail", {"retryable": False})):
        response = post(client, path, {"token": token, "lease_id": "not-the-lease", **extra})
        assert_problem(response, 409, "lease_lost")


def test_complete_of_an_unknown_token_is_404(client: Any) -> None:
    response = post(client, "/token/complete", {"token": "B" * 43, "lease_id": "x", "result": 1})
    assert_problem(response, 404, "token_invalid")


def test_unknown_routes_and_methods_are_problems_too(client: Any) -> None:
    assert_problem(client.get("/token/nope"), 404, "not_found")
    assert_problem(client.get("/token/consume"), 405, "method_not_allowed")
