"""The operators' tools (token_service.ops.admin) on a real standalone Redis and a real Cluster."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import pytest
from flask import Flask, request

from tests.ops.clock import past_clock
from tests.support.processes import wait_until
from tests.support.service import API_KEY, AUTH
from token_service import create_app
from token_service.client.wsgi import IdempotencyMiddleware
from token_service.errors import InvalidRequest, LeaseLost, TokenInvalid
from token_service.ops.admin import (
    IDEMPOTENCY,
    TOKEN,
    Admin,
    Filter,
    NotInProgress,
    RecordNotFound,
    _Resume,
)
from token_service.records import IssueRequest, UseRequest
from token_service.store import TokenStore
from token_service.tokens import token_digest

HANG = {"item": 1, "hang": True}
PAY = IssueRequest("pay", "user-7", None, 600)


def _issue(store: TokenStore, count: int = 1, request: IssueRequest = PAY) -> list[str]:
    return store.issue(request, count)


def test_a_token_ref_from_the_access_log_finds_its_record(
    redis_any: Any, admin: Admin, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="token_service.access")
    app = create_app({"api_keys": API_KEY, "redis_client": redis_any, "rate_limit": "off"})
    client = app.test_client()
    token = client.post("/token/generate", json={"scope": "pay", "subject": "user-7"}).json["token"]
    consumed = client.post(
        "/token/consume",
        json={"token": token, "scope": "pay", "subject": "user-7", "request_id": "order-1138"},
        headers=AUTH,
    )
    assert consumed.status_code == 200
    access = [record for record in caplog.records if record.name == "token_service.access"]
    token_ref = access[-1].token_ref  # what an operator copies out of the log line

    record = admin.show(token_ref)
    assert record.kind == TOKEN
    assert record.key.endswith(token_ref)
    shown = record.to_dict()
    assert shown["state"] == "CONSUMED"
    assert (shown["scope"], shown["subject"], shown["request_id"]) == ("pay", "user-7", "order-1138")
    assert 0 < shown["expires_in_seconds"] <= 300
    assert token not in json.dumps(shown)


def test_a_refusals_problem_document_names_the_record(redis_any: Any, admin: Admin) -> None:
    """What the customer holds after "refused as a duplicate": the problem document's token_ref."""
    app = create_app({"api_keys": API_KEY, "redis_client": redis_any, "rate_limit": "off"})
    client = app.test_client()
    token = client.post("/token/generate", json={"scope": "pay", "subject": "user-7"}).json["token"]
    body = {"token": token, "scope": "pay", "subject": "user-7", "request_id": "order-2001"}
    assert client.post("/token/consume", json=body, headers=AUTH).status_code == 200
    refusals = [
        client.post("/token/consume", json={**body, "request_id": "order-2002"}, headers=AUTH),  # hot path
        client.post("/token/begin", json={**body, "request_id": "order-2003"}, headers=AUTH),  # Flask
        client.post("/token/consume", json={**body, "scope": "refund"}, headers=AUTH),  # token_mismatch
    ]
    assert [refused.json["code"] for refused in refusals] == ["token_used", "token_used", "token_mismatch"]
    for refused in refusals:
        assert refused.json["token_ref"] == token_digest(token)
        assert token not in refused.get_data(as_text=True)
    record = admin.show(refusals[0].json["token_ref"]).to_dict()
    assert (record["state"], record["request_id"]) == ("CONSUMED", "order-2001")
    # a request that named no token has none
    unknown = client.post("/token/consume", json={"scope": "pay"}, headers=AUTH)
    assert unknown.status_code == 400
    assert "token_ref" not in unknown.json


def test_show_reports_lease_time_left_and_stored_results(store: TokenStore, admin: Admin) -> None:
    running, done, failed = _issue(store, 3)
    store.begin(UseRequest(running, "pay", "user-7", request_id="r-run"), lease_seconds=120)
    for token, request_id in ((done, "r-done"), (failed, "r-failed")):
        started = store.begin(UseRequest(token, "pay", "user-7", request_id=request_id))
        assert not isinstance(started, type(None))
    store.complete(
        done, store.begin(UseRequest(done, "pay", "user-7", request_id="r-done")).lease_id, {"charge": "ch_1"}
    )  # type: ignore[union-attr]
    lease = store.begin(UseRequest(failed, "pay", "user-7", request_id="r-failed")).lease_id  # type: ignore[union-attr]
    store.fail(failed, lease, retryable=False, error={"reason": "card_declined"})

    shown = admin.show(token_digest(running)).to_dict()
    assert shown["state"] == "PROCESSING"
    assert 100 < shown["lease_expires_in_seconds"] <= 120
    assert shown["lease_expired"] is False
    assert 500 < shown["token_expires_in_seconds"] <= 600
    assert shown["request_id"] == "r-run"
    assert admin.show(token_digest(done)).to_dict()["result"] == {"charge": "ch_1"}
    assert admin.show(token_digest(failed)).to_dict()["error"] == {"reason": "card_declined"}


def test_revoke_makes_the_token_unusable(store: TokenStore, admin: Admin) -> None:
    [token] = _issue(store)
    revoked = admin.revoke(token_digest(token))
    assert revoked.state == "ISSUED"
    with pytest.raises(TokenInvalid):
        store.consume(UseRequest(token, "pay", "user-7"))
    with pytest.raises(RecordNotFound):
        admin.show(token_digest(token))
    with pytest.raises(RecordNotFound):
        admin.revoke(token_digest(token))


def test_release_ends_a_live_lease_and_fences_out_its_holder(store: TokenStore, admin: Admin) -> None:
    [token] = _issue(store)
    holder = store.begin(UseRequest(token, "pay", "user-7", request_id="hung"), lease_seconds=600)
    assert admin.release(token_digest(token)) == "released"
    assert admin.show(token_digest(token)).state == "ISSUED"
    with pytest.raises(LeaseLost):
        store.complete(token, holder.lease_id, {"late": True})  # type: ignore[union-attr]
    retry = store.begin(UseRequest(token, "pay", "user-7", request_id="retry"))
    assert retry.replayed is False  # type: ignore[union-attr]


def test_release_of_a_run_out_lease_and_of_records_not_in_progress(redis_any: Any, admin: Admin) -> None:
    past = TokenStore(redis_any, clock_ms=past_clock(30))
    expired, issued = past.issue(PAY, 2)
    past.begin(UseRequest(expired, "pay", "user-7", request_id="dead"), lease_seconds=1)
    assert admin.show(token_digest(expired)).lease_expired
    assert admin.release(token_digest(expired)) == "lease_expired"
    with pytest.raises(NotInProgress):
        admin.release(token_digest(issued))


def test_refs_are_checked_before_they_reach_redis(admin: Admin) -> None:
    for bad in ("*", "ab*cd?ef[g]", "short", "x" * 23, "ts:t:abc", ""):
        with pytest.raises(InvalidRequest):
            admin.show(bad)
    with pytest.raises(InvalidRequest):
        admin.show("abcdefgh")  # a prefix names no single record: find_by_ref_prefix does
    with pytest.raises(RecordNotFound):
        admin.show("A" * 22)


def test_a_short_ref_from_old_logs_is_found_by_a_bounded_scan(store: TokenStore, admin: Admin) -> None:
    tokens = _issue(store, 50)
    wanted = token_digest(tokens[17])
    refs = []
    page = admin.find_by_ref_prefix(wanted[:8], count=10)
    refs += [record.ref for record in page.records]
    while not page.done:
        page = admin.find_by_ref_prefix(wanted[:8], page.cursor, count=10)
        refs += [record.ref for record in page.records]
    assert refs == [wanted]


def test_find_by_request_id(store: TokenStore, admin: Admin) -> None:
    tokens = _issue(store, 20)
    store.consume(UseRequest(tokens[3], "pay", "user-7", request_id="checkout-42"))
    store.begin(UseRequest(tokens[9], "pay", "user-7", request_id="checkout-43"))
    found = list(admin.walk(Filter(kind=TOKEN, request_id="checkout-42"), count=5))
    assert [record.ref for record in found] == [token_digest(tokens[3])]
    page = admin.find_by_request_id("checkout-43")
    while not page.records and not page.done:
        page = admin.find_by_request_id("checkout-43", page.cursor)
    assert [record.state for record in page.records] == ["PROCESSING"]


def test_list_by_state_and_scope_walks_every_node_once(store: TokenStore, admin: Admin) -> None:
    issued = _issue(store, 30)
    other_scope = _issue(store, 10, IssueRequest("refund", None, None, 600))
    for token in issued[:12]:
        store.consume(UseRequest(token, "pay", "user-7"))
    for token in other_scope[:4]:
        store.consume(UseRequest(token, "refund"))

    def refs(wanted: Filter) -> list[str]:
        seen, cursor = [], "0"
        while True:
            page = admin.list(wanted, cursor, count=3, limit=5)
            seen += [record.ref for record in page.records]
            if page.done:
                return seen
            cursor = page.cursor

    consumed_pay = refs(Filter(state="CONSUMED", scope="pay"))
    assert sorted(consumed_pay) == sorted(token_digest(token) for token in issued[:12])
    assert len(refs(Filter(state="ISSUED"))) == 18 + 6
    assert len(refs(Filter(kind=TOKEN))) == 40
    assert len(admin.nodes()) == (3 if store._cluster else 1)


UNKNOWN_CURSOR = ("The cursor is not one this walk handed out.", {"cursor": ["Unknown cursor."]})


def test_a_cursor_not_handed_out_is_refused(admin: Admin) -> None:
    for cursor in ("x", "9.0", "0.-1", "1.2.3", "0." + "9" * 25, "0.18446744073709551616", "0.²", "٣"):
        with pytest.raises(InvalidRequest) as refused:
            admin.list(Filter(), cursor)
        assert (refused.value.detail, refused.value.errors) == UNKNOWN_CURSOR


def test_redis_refusing_a_cursor_is_a_bad_request(admin: Admin, monkeypatch: pytest.MonkeyPatch) -> None:
    # past the format check (as a server would be whose SCAN reads fewer bits): Redis's own reply,
    # answered as the format check answers
    monkeypatch.setattr("token_service.ops.admin._cursor", lambda text, nodes: _Resume(0, 2**64))
    with pytest.raises(InvalidRequest) as refused:
        admin.list(Filter(), "0.1")
    assert (refused.value.detail, refused.value.errors) == UNKNOWN_CURSOR


@pytest.mark.parametrize(
    ("identity", "key"), [("\ud800", "k"), ("a\x00b", "k"), ("alice", "k\udcff"), ("alice", "k\n"), ("", "k")]
)
def test_an_identity_or_key_that_is_not_plain_text_is_refused(admin: Admin, identity: str, key: str) -> None:
    with pytest.raises(InvalidRequest):
        admin.show_idempotency(identity, key)


def _orders_app(redis_any: Any, **options: Any) -> Flask:
    app = Flask(__name__)
    app.config["gate"] = threading.Event()

    @app.post("/orders")
    def order() -> Any:
        if request.get_json().get("hang"):
            app.config["gate"].wait(30)  # a request hung on a slow provider
        return {"order": 1}, 201

    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, redis_any, **options)  # type: ignore[method-assign]
    return app


def test_an_idempotency_key_is_found_by_key_and_client_identity(redis_any: Any, admin: Admin) -> None:
    app = _orders_app(redis_any)
    headers = {"Authorization": "Bearer alice-secret", "Idempotency-Key": '"order-2024-0001"'}
    assert app.test_client().post("/orders", json={"item": 1}, headers=headers).status_code == 201

    record = admin.show_idempotency("Bearer alice-secret", "order-2024-0001")
    shown = record.to_dict()
    assert record.kind == IDEMPOTENCY
    assert shown["state"] == "COMPLETED"
    assert shown["response"]["status"] == 201
    assert json.loads(shown["response"]["body"]) == {"order": 1}
    assert 86000 < shown["expires_in_seconds"] <= 86400
    assert "alice-secret" not in json.dumps(shown)
    assert "order-2024-0001" not in json.dumps(shown)
    with pytest.raises(RecordNotFound):
        admin.show_idempotency("Bearer mallory", "order-2024-0001")  # another client's namespace

    # found by its ref alone too, and listed
    assert admin.show(record.ref).kind == IDEMPOTENCY
    assert [r.ref for r in admin.walk(Filter(kind=IDEMPOTENCY, state="COMPLETED"))] == [record.ref]

    # revoked: the stored response is forgotten and the next request runs
    admin.revoke(record.ref)
    with pytest.raises(RecordNotFound):
        admin.show(record.ref)


def test_a_stuck_idempotency_claim_is_released_for_the_retry(redis_any: Any, admin: Admin) -> None:
    app = _orders_app(redis_any, lock_seconds=3600)
    headers = {"Authorization": "Bearer bob", "Idempotency-Key": "k-77"}
    gate = app.config["gate"]
    hung = threading.Thread(target=lambda: app.test_client().post("/orders", json=HANG, headers=headers))
    hung.start()
    wait_until(lambda: admin._find(admin.idempotency_ref("Bearer bob", "k-77"), IDEMPOTENCY) is not None)
    assert app.test_client().post("/orders", json=HANG, headers=headers).status_code == 409  # still claimed

    record = admin.show_idempotency("Bearer bob", "k-77")
    assert record.state == "PROCESSING"
    assert 3500 < record.to_dict()["lease_expires_in_seconds"] <= 3600
    assert admin.release(record.ref) == "released"
    gate.set()  # the retry runs through
    assert app.test_client().post("/orders", json=HANG, headers=headers).status_code == 201
    with pytest.raises(NotInProgress):
        admin.release(record.ref)
    hung.join(30)  # the hung request ended too: its late response did not replace the retry's
    assert admin.show(record.ref).state == "COMPLETED"


def test_one_audit_line_per_action_and_no_secrets(store: TokenStore, admin: Admin, audit_lines: Any) -> None:
    [token] = _issue(store)
    ref = token_digest(token)
    admin.show(ref)
    store.begin(UseRequest(token, "pay", "user-7"), lease_seconds=60)
    admin.release(ref)
    admin.revoke(ref)
    with pytest.raises(RecordNotFound):
        admin.release(ref)
    admin.list(Filter(state="ISSUED"))
    with pytest.raises(RecordNotFound):
        admin.show_idempotency("Bearer secret-credential", "my-key-123")

    audited = audit_lines()
    lines = [(r.action, r.outcome) for r in audited]  # type: ignore[attr-defined]
    assert lines == [
        ("show", "found"),
        ("release", "released"),
        ("revoke", "revoked"),
        ("release", "not_found"),
        ("list", "0 found"),
        ("show", "not_found"),
    ]
    assert all(r.actor == "test" and r.audit is True for r in audited)  # type: ignore[attr-defined]
    text = repr([r.__dict__ for r in audited])
    assert token not in text
    assert "secret-credential" not in text
    assert "my-key-123" not in text
