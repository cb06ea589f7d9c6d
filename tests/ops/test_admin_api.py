"""The admin HTTP routes: their own key, the same tools as the CLI, problem+json for everything else."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from tests.support import raw_http
from tests.support.processes import Gunicorn, RedisServer, free_port
from tests.support.service import API_KEY, AUTH, service_env
from token_service import create_app
from token_service.client import TokenClient, TokenUsed
from token_service.config import ConfigError, Settings
from token_service.records import IssueRequest, UseRequest
from token_service.server.routes import TOKEN_ROUTES
from token_service.store import TokenStore
from token_service.tokens import token_digest

ADMIN_KEY = "admin-key-for-the-ops-tests-0001"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
PAY = IssueRequest("pay", "user-7", None, 600)


@pytest.fixture
def http(redis_any: Any) -> Any:
    app = create_app(
        {"api_keys": API_KEY, "admin_keys": ADMIN_KEY, "redis_client": redis_any, "rate_limit": "off"}
    )
    return app.test_client()


def test_the_admin_key_and_the_service_key_open_only_their_own_routes(http: Any, store: TokenStore) -> None:
    [token] = store.issue(PAY)
    ref = token_digest(token)
    assert http.get(f"/admin/records/{ref}", headers=ADMIN).status_code == 200
    for headers in (
        AUTH,
        {},
        {"Authorization": "Bearer " + ADMIN_KEY[:-1] + "2"},
        {"Authorization": ADMIN_KEY},
    ):
        refused = http.get(f"/admin/records/{ref}", headers=headers)
        assert refused.status_code == 401
        assert refused.json["code"] == "unauthorized"
        assert refused.headers["Content-Type"] == "application/problem+json"
        assert refused.headers["WWW-Authenticate"].startswith("Bearer")
    # every route that takes a service key (the hot path's consume included) refuses the admin key
    keyed = [route for route in TOKEN_ROUTES if route.needs_key]
    assert {route.path for route in keyed} >= {"/token/consume", "/token/begin", "/token/revoke"}
    body = {"token": token, "scope": "pay", "subject": "user-7", "lease_id": "x" * 22, "result": {}}
    for route in keyed:
        refused = http.open(route.path, method=route.method, json=body, headers=ADMIN)
        assert refused.status_code == 401, route.path
        assert refused.json["code"] == "unauthorized", route.path
    assert http.post("/token/inspect", json={"token": token}, headers=AUTH).json["state"] == "ISSUED"
    # and every admin route refuses the service key
    admin_rules = [rule for rule in http.application.url_map.iter_rules() if rule.rule.startswith("/admin")]
    assert len(admin_rules) == 5
    for rule in admin_rules:
        path = rule.rule.replace("<ref>", ref)
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            refused = http.open(
                path, method=method, json={"identity": "x", "idempotency_key": "k"}, headers=AUTH
            )
            assert refused.status_code == 401, (method, path)
            assert refused.json["code"] == "unauthorized"
    assert http.get(f"/admin/records/{ref}", headers=ADMIN).json["state"] == "ISSUED"  # nothing changed


def test_no_admin_key_configured_means_no_admin_api(redis_any: Any) -> None:
    http = create_app({"api_keys": API_KEY, "redis_client": redis_any}).test_client()
    for headers in (AUTH, ADMIN, {}):
        refused = http.get("/admin/records", headers=headers)
        assert refused.status_code == 401
    assert "ADMIN_KEYS" in refused.json["detail"]


def test_a_key_in_both_lists_is_refused_at_start() -> None:
    with pytest.raises(ConfigError, match="ADMIN_KEYS"):
        Settings.from_mapping({"api_keys": API_KEY, "admin_keys": f"{ADMIN_KEY},{API_KEY}"})
    digest = hashlib.sha256(API_KEY.encode()).hexdigest()
    with pytest.raises(ConfigError, match="ADMIN_KEYS"):
        Settings.from_mapping({"api_keys": API_KEY, "admin_keys": f"sha256:{digest}"})


def test_show_list_release_and_revoke_over_http(http: Any, store: TokenStore, audit_lines: Any) -> None:
    held, issued = store.issue(PAY, 2)
    store.begin(UseRequest(held, "pay", "user-7", request_id="order-9"), lease_seconds=300)
    ref = token_digest(held)

    shown = http.get(f"/admin/records/{ref}", headers=ADMIN)
    assert shown.headers["Cache-Control"] == "no-store"
    assert shown.json["state"] == "PROCESSING"
    assert shown.json["request_id"] == "order-9"
    assert 0 < shown.json["lease_expires_in_seconds"] <= 300

    listed, cursor = [], "0"
    while True:
        page = http.get(f"/admin/records?state=PROCESSING&scope=pay&count=1&cursor={cursor}", headers=ADMIN)
        assert page.status_code == 200
        listed += [record["ref"] for record in page.json["records"]]
        cursor = page.json["cursor"]
        if page.json["done"]:
            break
    assert listed == [ref]
    stuck = http.get("/admin/records?state=PROCESSING&lease_expired=true", headers=ADMIN)
    assert stuck.json["records"] == []
    found = http.get("/admin/records?request_id=order-9", headers=ADMIN)
    assert [record["ref"] for record in found.json["records"]] == [ref]
    by_prefix = http.get(f"/admin/records?ref_prefix={ref[:10]}", headers=ADMIN)
    assert [record["ref"] for record in by_prefix.json["records"]] == [ref]

    released = http.post(f"/admin/records/{ref}/release", headers=ADMIN)
    assert released.json == {"outcome": "released", "ref": ref}
    again = http.post(f"/admin/records/{ref}/release", headers=ADMIN)
    assert again.status_code == 409
    assert again.json["code"] == "not_in_progress"
    revoked = http.post(f"/admin/records/{token_digest(issued)}/revoke", headers=ADMIN)
    assert revoked.json["was"] == "ISSUED"
    gone = http.get(f"/admin/records/{token_digest(issued)}", headers=ADMIN)
    assert gone.status_code == 404
    assert gone.json["code"] == "not_found"

    actors = {record.actor for record in audit_lines()}
    assert actors == {"admin-key:" + hashlib.sha256(ADMIN_KEY.encode()).hexdigest()[:12]}
    assert ADMIN_KEY not in repr([record.__dict__ for record in audit_lines()])


def test_an_idempotency_key_is_looked_up_with_a_post(http: Any, redis_any: Any) -> None:
    from token_service.client._idempotency_store import IdempotencyStore

    claims = IdempotencyStore(redis_any)
    claims.begin(claims.key("Bearer dave", "order-1"), "fp", "owner", 600)
    found = http.post(
        "/admin/idempotency/lookup",
        json={"identity": "Bearer dave", "idempotency_key": "order-1"},
        headers=ADMIN,
    )
    assert found.status_code == 200
    assert found.json["state"] == "PROCESSING"
    released = http.post(f"/admin/records/{found.json['ref']}/release?kind=idempotency", headers=ADMIN)
    assert released.json["outcome"] == "released"
    missing = http.post(
        "/admin/idempotency/lookup",
        json={"identity": "Bearer dave", "idempotency_key": "order-1"},
        headers=ADMIN,
    )
    assert missing.status_code == 404


def test_a_ref_prefix_finds_records_of_the_kind_asked_for(
    http: Any, redis_any: Any, store: TokenStore
) -> None:
    # issue 33: with kind=idempotency a ref_prefix matched nothing (it walked token keys only), and
    # the other filters were dropped beside a ref_prefix
    from token_service.client._idempotency_store import IdempotencyStore

    claims = IdempotencyStore(redis_any)
    claims.begin(claims.key("Bearer dave", "order-1"), "fp", "owner", 600)
    [claim] = [key.decode().rsplit(":", 1)[1] for key in redis_any.scan_iter(match="ts:ik:*")]
    [token] = store.issue(PAY)
    ref = token_digest(token)

    def refs(query: str) -> list[tuple[str, str]]:
        page = http.get(f"/admin/records?{query}", headers=ADMIN)
        assert page.status_code == 200, page.json
        assert page.json["done"], page.json
        return sorted((record["kind"], record["ref"]) for record in page.json["records"])

    assert refs(f"ref_prefix={claim[:8]}&kind=idempotency") == [("idempotency", claim)]
    assert refs(f"ref_prefix={claim[:8]}") == [("idempotency", claim)]
    assert refs(f"ref_prefix={claim[:8]}&kind=token") == []
    assert refs(f"ref_prefix={ref[:8]}&kind=token") == [("token", ref)]
    assert refs(f"ref_prefix={ref[:8]}&kind=idempotency") == []
    assert refs(f"ref_prefix={ref[:8]}") == [("token", ref)]
    assert refs(f"ref_prefix={ref[:8]}&state=ISSUED") == [("token", ref)]
    assert refs(f"ref_prefix={ref[:8]}&state=CONSUMED") == []
    assert refs(f"ref_prefix={claim[:8]}&state=PROCESSING&kind=idempotency") == [("idempotency", claim)]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("get", "/admin/records/*", None),
        ("get", "/admin/records/aaaa[b]cc", None),
        ("get", "/admin/records/" + "a" * 23, None),
        ("get", "/admin/records?state=LOST", None),
        ("get", "/admin/records?cursor=7.12", None),
        ("get", "/admin/records?cursor=0.99999999999999999999999", None),
        ("get", "/admin/records?count=0", None),
        ("get", "/admin/records?count=%C2%B2", None),
        ("get", "/admin/records?limit=%C2%B2", None),
        ("get", "/admin/records?cursor=%C2%B2", None),
        ("get", "/admin/records?cursor=0.%C2%B2", None),
        ("get", "/admin/records?limit=" + "9" * 40, None),
        # past int()'s 4300-digit limit (a ValueError, so a 500); gunicorn's 4094-byte request line
        # stops these, the app itself must too (another server, a larger limit_request_line)
        ("get", "/admin/records?count=" + "9" * 5000, None),
        ("get", "/admin/records?limit=" + "9" * 5000, None),
        ("get", "/admin/records?count=" + "0" * 5000 + "5", None),
        ("get", "/admin/records?count=-5", None),
        ("get", "/admin/records?count=%2B5", None),
        ("get", "/admin/records?count=99999", None),
        ("get", "/admin/records?lease_expired=maybe", None),
        ("get", "/admin/records?ref_prefix=a*", None),
        ("get", "/admin/records?scope=%00", None),
        ("get", "/admin/records/" + "a" * 22 + "?kind=other", None),
        ("post", "/admin/idempotency/lookup", {"identity": "", "idempotency_key": "k"}),
        ("post", "/admin/idempotency/lookup", {"identity": "x", "idempotency_key": 5}),
        ("post", "/admin/idempotency/lookup", {"identity": "x", "idempotency_key": "k", "more": 1}),
        ("post", "/admin/idempotency/lookup", [1]),
        ("post", "/admin/idempotency/lookup", {"identity": "\ud800", "idempotency_key": "k"}),
        ("post", "/admin/idempotency/lookup", {"identity": "Bearer a\u0000", "idempotency_key": "k"}),
        ("post", "/admin/idempotency/lookup", {"identity": "Bearer a", "idempotency_key": "\udfff"}),
        ("post", "/admin/idempotency/lookup", {"identity": "Bearer a", "idempotency_key": "k\u001b[2J"}),
    ],
)
def test_bad_input_is_a_400_problem(http: Any, method: str, path: str, body: Any) -> None:
    answer = getattr(http, method)(path, json=body, headers=ADMIN)
    assert answer.status_code == 400, answer.json
    assert answer.json["code"] == "invalid_request"


def test_the_lookup_takes_json_only(http: Any) -> None:
    # issue 26: text/plain was read as JSON; every other JSON route refuses it
    document = b'{"identity": "Bearer dave", "idempotency_key": "order-1"}'
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {**ADMIN, **({"Content-Type": content_type} if content_type else {})}
        answer = http.post("/admin/idempotency/lookup", data=document, headers=headers)
        assert answer.status_code == 400, content_type
        assert answer.json["code"] == "invalid_request"
        assert answer.json["errors"] == {"body": ["Not JSON."]}
    headers = {**ADMIN, "Content-Type": "application/json; charset=utf-8"}
    assert http.post("/admin/idempotency/lookup", data=document, headers=headers).status_code == 404


def test_refused_admin_calls_write_one_audit_line_each(http: Any, audit_lines: Any) -> None:
    basic = "Basic " + base64.b64encode(b"root:hunter2").decode()
    service_digest = hashlib.sha256(API_KEY.encode()).hexdigest()[:12]
    admin_digest = hashlib.sha256(ADMIN_KEY.encode()).hexdigest()[:12]
    revoke = "/admin/records/" + "a" * 22 + "/revoke"
    cases = [
        ("get", "/admin/records", {}, 401, "anonymous"),
        ("get", "/admin/records", AUTH, 401, "key:" + service_digest),
        ("get", "/admin/records/" + "a" * 22, {"Authorization": basic}, 401, "basic-credentials"),
        ("post", revoke, {"Authorization": "{weird} x"}, 401, "malformed-credentials"),
        ("get", "/admin/records/*", ADMIN, 400, "admin-key:" + admin_digest),
        ("get", "/admin/records?cursor=zz", ADMIN, 400, "admin-key:"),
        ("get", "/admin/records?limit=0", ADMIN, 400, "admin-key:"),
        ("post", "/admin/records/" + "b" * 22 + "/release?kind=x", ADMIN, 400, "admin-key:"),
        ("post", "/admin/idempotency/lookup", ADMIN, 400, "admin-key:"),
    ]
    for method, path, headers, status, actor in cases:
        before = len(audit_lines())
        answer = getattr(http, method)(path, headers=headers)
        assert answer.status_code == status, (path, answer.json)
        lines = audit_lines()[before:]
        assert len(lines) == 1, (path, lines)
        line = lines[0]
        assert line.outcome == "refused"
        assert line.status == status
        assert line.code == answer.json["code"]
        assert line.actor.startswith(actor), (line.actor, actor)
        shown = json.dumps({name: str(value) for name, value in vars(line).items()})
        for secret in (API_KEY, ADMIN_KEY, "hunter2", basic.split()[1]):
            assert secret not in shown
    by_path = [line for line in audit_lines() if line.outcome == "refused"]
    assert [line.action for line in by_path[1:4]] == ["list", "show", "revoke"]
    assert by_path[5].fields == ["cursor"]
    assert by_path[4].ref is None  # "*" is no ref: nothing of the path is written
    # a ref of the right shape is named; a found record's own line is the action's (one line, not two)
    before = len(audit_lines())
    assert http.get("/admin/records/" + "c" * 22, headers=ADMIN).status_code == 404
    assert [(line.outcome, line.ref) for line in audit_lines()[before:]] == [("not_found", "c" * 22)]


def test_redis_down_is_a_503(redis_any: Any) -> None:
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    http = create_app({"api_keys": API_KEY, "admin_keys": ADMIN_KEY, "redis_client": dead}).test_client()
    for answer in (
        http.get("/admin/records", headers=ADMIN),
        http.get("/admin/records/" + "a" * 22, headers=ADMIN),
    ):
        assert answer.status_code == 503
        assert answer.json["code"] == "store_unavailable"
    dead.close()


# -- as an attacker, under gunicorn: bytes no HTTP client library would send ----------------------

STABLE_CODES = {"unauthorized", "invalid_request", "not_found", "method_not_allowed", "payload_too_large"}


@pytest.fixture(scope="module")
def gunicorn_admin() -> Iterator[Gunicorn]:
    redis_server = RedisServer().start()
    server = Gunicorn(service_env(redis_server.url, TOKEN_SERVICE_ADMIN_KEYS=ADMIN_KEY), workers=1).start()
    yield server
    server.stop()
    redis_server.stop()


def _raw(server: Gunicorn, head: bytes, body: bytes = b"") -> raw_http.Reply:
    framing = b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body) if body else b""
    request = head.replace(b"\r\n\r\n", b"\r\nHost: t\r\nConnection: close\r\n" + framing + b"\r\n", 1)
    return raw_http.exchange(("127.0.0.1", server.port), request + body)


ADMIN_LINE = b"Authorization: Bearer " + ADMIN_KEY.encode()
SERVICE_LINE = b"Authorization: Bearer " + API_KEY.encode()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("head", "body", "status"),
    [
        (b"GET /admin/records HTTP/1.1\r\n\r\n", b"", 401),  # no key
        (b"GET /admin/records HTTP/1.1\r\n" + SERVICE_LINE + b"\r\n\r\n", b"", 401),  # a backend key
        (b"GET /admin/records HTTP/1.1\r\nAuthorization: Bearer \xff\xfe\xed\xa0\x80\r\n\r\n", b"", 401),
        (
            b"GET /admin/records HTTP/1.1\r\nAuthorization: Basic " + ADMIN_KEY.encode() + b"\r\n\r\n",
            b"",
            401,
        ),
        (
            b"GET /admin/records/\xff\xfe\xfdabcdefghijklmnopqrs HTTP/1.1\r\n" + ADMIN_LINE + b"\r\n\r\n",
            b"",
            400,
        ),
        (
            b"GET /admin/records/%FF%FE%FDabcdefghijklmnopqrs HTTP/1.1\r\n" + ADMIN_LINE + b"\r\n\r\n",
            b"",
            400,
        ),
        (b"GET /admin/records/abcdefghijklmnopqrstu%00 HTTP/1.1\r\n" + ADMIN_LINE + b"\r\n\r\n", b"", 400),
        (
            b"GET /admin/records?scope=%FF%FE&state=%ED%A0%80 HTTP/1.1\r\n" + ADMIN_LINE + b"\r\n\r\n",
            b"",
            400,
        ),
        (b"GET /admin/records?ref_prefix=\xff\xfeabcdef HTTP/1.1\r\n" + ADMIN_LINE + b"\r\n\r\n", b"", 400),
        (b"GET /admin/records?cursor=0.%FF HTTP/1.1\r\n" + ADMIN_LINE + b"\r\n\r\n", b"", 400),
        (b"GET /admin/records?cursor=-1 HTTP/1.1\r\n" + ADMIN_LINE + b"\r\n\r\n", b"", 400),
        (b"GET /admin/records?cursor=3.0 HTTP/1.1\r\n" + ADMIN_LINE + b"\r\n\r\n", b"", 400),
        (b"GET /admin/records?count=-5 HTTP/1.1\r\n" + ADMIN_LINE + b"\r\n\r\n", b"", 400),
        (b"GET /admin/records?limit=1e3 HTTP/1.1\r\n" + ADMIN_LINE + b"\r\n\r\n", b"", 400),
        (b"GET /admin/records?count=" + b"9" * 4000 + b" HTTP/1.1\r\n" + ADMIN_LINE + b"\r\n\r\n", b"", 400),
        (b"GET /admin/records?count=" + b"9" * 5000 + b" HTTP/1.1\r\n" + ADMIN_LINE + b"\r\n\r\n", b"", 414),
        (b"DELETE /admin/records/" + b"a" * 22 + b" HTTP/1.1\r\n" + ADMIN_LINE + b"\r\n\r\n", b"", 405),
        (b"POST /admin/idempotency/lookup HTTP/1.1\r\n" + ADMIN_LINE + b"\r\n\r\n", b"\xff\xfe{}", 400),
        (
            b"POST /admin/idempotency/lookup HTTP/1.1\r\n" + ADMIN_LINE + b"\r\n\r\n",
            b'{"identity":"Bearer \\udc80","idempotency_key":"k"}',
            400,
        ),
        (
            b"POST /admin/idempotency/lookup HTTP/1.1\r\n" + ADMIN_LINE + b"\r\n\r\n",
            b'{"identity":"Bearer \xc3\x28","idempotency_key":"k"}',  # invalid UTF-8 inside a string
            400,
        ),
    ],
)
def test_hostile_bytes_are_problems_never_500(
    gunicorn_admin: Gunicorn, head: bytes, body: bytes, status: int
) -> None:
    reply = _raw(gunicorn_admin, head, body)
    assert reply.status == status, reply.body
    assert reply.headers["content-type"] == "application/problem+json"
    assert reply.json()["code"] in STABLE_CODES
    assert ADMIN_KEY.encode() not in gunicorn_admin.log().encode()  # not even in a log line


@pytest.mark.slow
def test_the_sdks_error_carries_the_token_ref_that_finds_the_record(gunicorn_admin: Gunicorn) -> None:
    """A backend on the SDK logs the refusal's token_ref; the operator's admin call finds the record."""
    with TokenClient(gunicorn_admin.url, API_KEY) as client:
        token = client.generate("pay", subject="user-9")
        client.consume(token.token, "pay", subject="user-9", request_id="order-31")
        with pytest.raises(TokenUsed) as refused:
            client.consume(token.token, "pay", subject="user-9", request_id="order-32")
    assert refused.value.token_ref == token_digest(token.token)
    shown = httpx.get(f"{gunicorn_admin.url}/admin/records/{refused.value.token_ref}", headers=ADMIN)
    assert (shown.json()["state"], shown.json()["request_id"]) == ("CONSUMED", "order-31")
