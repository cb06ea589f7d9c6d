"""The Idempotency-Key WSGI middleware and its Lua scripts, on fakeredis and a real redis-server."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from flask import Flask, Response, request

from tests.support.processes import wait_until
from token_service.client._idempotency_store import Claimed, IdempotencyStore, InProgress, Mismatch
from token_service.client._stored_response import StoredResponse
from token_service.client.wsgi import IdempotencyMiddleware
from token_service.records import read_record
from token_service.scripts import lua_source

KEY = '"8e03978e-40d5-43e8-bc93-6894a57f9324"'


def orders_app(redis_client: Any, **options: Any) -> Flask:
    app = Flask(__name__)
    app.config["runs"] = []
    app.config["gate"] = None

    @app.post("/orders")
    def create_order() -> Any:
        body = request.get_json()
        app.config["runs"].append(body)
        gate: threading.Event | None = app.config["gate"]
        if gate is not None:
            gate.wait(60)  # the test sets it once its duplicates are in: the bound only ends a broken run
        if body.get("fail") == "crash":
            raise RuntimeError("bug")
        if body.get("fail") == "503":
            return {"error": "bank down"}, 503
        if "status" in body:
            return {"status": body["status"]}, body["status"], {"Retry-After": "1"}
        if "stream" in body:

            def chunks() -> Any:
                for number in range(body["stream"]):
                    if body.get("break_at") == number:
                        raise RuntimeError("the stream broke")
                    yield b"x" * 1000

            return Response(chunks(), 200, {"Content-Type": "application/octet-stream"})
        if body.get("binary"):
            return b"\x00\xffraw", 201, {"Content-Type": "application/octet-stream"}
        number = len(app.config["runs"])
        return {"order": number, **body}, 201, {"Location": f"/orders/{number}", "Set-Cookie": "s=1"}

    @app.get("/orders")
    def list_orders() -> Any:
        return {"count": len(app.config["runs"])}

    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, redis_client, **options)  # type: ignore[method-assign]
    return app


def post(
    app: Flask, body: Any, key: str | None = KEY, user: str = "Bearer alice", path: str = "/orders"
) -> Any:
    headers = {"Authorization": user}
    if key is not None:
        headers["Idempotency-Key"] = key
    return app.test_client().post(path, json=body, headers=headers)


def test_first_request_runs_and_a_repeat_is_replayed(redis_client: Any) -> None:
    app = orders_app(redis_client)
    first = post(app, {"item": "book"})
    assert first.status_code == 201
    assert first.get_json() == {"order": 1, "item": "book"}
    assert "Idempotent-Replayed" not in first.headers
    for _ in range(2):
        again = post(app, {"item": "book"})
        assert again.status_code == 201
        assert again.get_data() == first.get_data()
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.headers["Location"] == "/orders/1"
        assert again.headers["Content-Type"] == "application/json"
        assert "Set-Cookie" not in again.headers
    # the bare form of the same key is the same key
    assert post(app, {"item": "book"}, key=KEY.strip('"')).headers["Idempotent-Replayed"] == "true"
    assert len(app.config["runs"]) == 1


def test_binary_responses_are_stored_compactly_and_replayed_exactly(redis_client: Any) -> None:
    app = orders_app(redis_client, ttl_seconds=60)
    first = post(app, {"binary": True})
    assert first.get_data() == b"\x00\xffraw"  # the test client sends the body when it is read
    again = post(app, {"binary": True})
    assert again.get_data() == first.get_data() == b"\x00\xffraw"
    assert again.headers["Content-Type"] == "application/octet-stream"
    (record_key,) = redis_client.keys("ts:ik:*")
    raw = redis_client.get(record_key)
    assert raw.startswith(b"S\x1e")  # the common record's SUCCEEDED, the response its payload
    assert read_record(raw.decode("utf-8", "surrogateescape")).state == "S"
    assert raw.endswith(b"\n\x00\xffraw")  # raw bytes, not base64 or escaped JSON
    assert len(raw) < 200
    assert 0 < redis_client.pttl(record_key) <= 60_000
    assert b"alice" not in record_key  # the identity is hashed into the key


def test_missing_key_is_400_when_required(redis_client: Any) -> None:
    app = orders_app(redis_client)
    missing = post(app, {"item": "book"}, key=None)
    assert missing.status_code == 400
    assert missing.mimetype == "application/problem+json"
    assert missing.get_json()["code"] == "invalid_request"
    assert "Idempotency-Key" in missing.get_json()["errors"]
    assert post(app, {"item": "book"}, key="x" * 300).status_code == 400
    assert post(app, {"item": "book"}, key='"é"').status_code == 400
    assert app.config["runs"] == []


def test_missing_key_passes_through_when_optional(redis_client: Any) -> None:
    app = orders_app(redis_client, required=False)
    assert post(app, {"item": "a"}, key=None).status_code == 201
    assert post(app, {"item": "a"}, key=None).status_code == 201
    assert len(app.config["runs"]) == 2


def test_safe_methods_are_untouched(redis_client: Any) -> None:
    app = orders_app(redis_client)
    response = app.test_client().get("/orders")
    assert response.status_code == 200
    assert "Idempotent-Replayed" not in response.headers


def test_a_concurrent_repeat_gets_409_with_retry_after(redis_client: Any) -> None:
    app = orders_app(redis_client, lock_seconds=30)
    gate = threading.Event()
    app.config["gate"] = gate
    answers: list[Any] = []
    first = threading.Thread(target=lambda: answers.append(post(app, {"item": "book"})))
    first.start()
    try:
        wait_until(lambda: app.config["runs"], what="the first request to run")
        busy = post(app, {"item": "book"})
        assert busy.status_code == 409
        assert busy.get_json()["code"] == "idempotency_key_in_use"
        assert 1 <= int(busy.headers["Retry-After"]) <= 30
    finally:
        gate.set()
        first.join()
    assert answers[0].status_code == 201
    assert post(app, {"item": "book"}).headers["Idempotent-Replayed"] == "true"
    assert len(app.config["runs"]) == 1


def test_the_same_key_with_a_different_request_is_422(redis_client: Any) -> None:
    app = orders_app(redis_client)
    assert post(app, {"item": "book"}).status_code == 201
    for other in (
        lambda: post(app, {"item": "lamp"}),
        lambda: post(app, {"item": "book"}, path="/orders?express=1"),
    ):
        response = other()
        assert response.status_code == 422
        assert response.get_json()["code"] == "idempotency_key_mismatch"
    assert len(app.config["runs"]) == 1


def test_keys_are_namespaced_per_client(redis_client: Any) -> None:
    app = orders_app(redis_client)
    alice = post(app, {"item": "book"}, user="Bearer alice")
    bob = post(app, {"item": "book"}, user="Bearer bob")
    assert "Idempotent-Replayed" not in bob.headers
    assert alice.get_json()["order"] == 1
    assert bob.get_json()["order"] == 2


def test_5xx_and_exceptions_are_not_stored_and_free_the_key(redis_client: Any) -> None:
    app = orders_app(redis_client)
    assert post(app, {"fail": "503"}).status_code == 503
    assert redis_client.keys("ts:ik:*") == []
    again = post(app, {"fail": "503"})
    assert again.status_code == 503
    assert "Idempotent-Replayed" not in again.headers
    assert post(app, {"fail": "crash"}, key='"k2"').status_code == 500
    assert redis_client.keys("ts:ik:*") == []
    assert len(app.config["runs"]) == 3
    # a fixed request with the freed key runs and is then stored
    assert post(app, {"ok": 1}, key='"k3"').status_code == 201
    assert post(app, {"ok": 1}, key='"k3"').headers["Idempotent-Replayed"] == "true"


def test_oversized_bodies_are_413(redis_client: Any) -> None:
    app = orders_app(redis_client, max_body_bytes=100)
    response = post(app, {"blob": "x" * 200})
    assert response.status_code == 413
    assert response.get_json()["code"] == "payload_too_large"
    assert app.config["runs"] == []


def test_redis_down_fails_closed_with_503() -> None:
    import redis

    dead = redis.Redis(port=1, socket_connect_timeout=0.2, retry=None)
    app = orders_app(dead)
    response = post(app, {"item": "book"})
    assert response.status_code == 503
    assert response.get_json()["code"] == "store_unavailable"
    assert app.config["runs"] == []


def test_a_stale_claim_is_fenced_out(redis_client: Any) -> None:
    store = IdempotencyStore(redis_client)
    key = store.key("alice", "k")
    assert store.begin(key, "fp", "owner-1", lock_seconds=30) == Claimed()
    redis_client.pexpire(key, 1)  # the first attempt's lock runs out (its process died)
    time.sleep(0.01)
    assert store.begin(key, "fp", "owner-2", lock_seconds=30) == Claimed()
    response = StoredResponse(201, b"late", [("Content-Type", "text/plain")])
    assert store.store(key, "fp", "owner-1", response, ttl_seconds=60) is False
    assert store.release(key, "owner-1") is False
    assert store.renew(key, "owner-1", lock_seconds=30) is False
    assert store.store(key, "fp", "owner-2", response, ttl_seconds=60) is True
    assert store.begin(key, "fp", "owner-3", lock_seconds=30) == response


def test_a_release_leaves_no_record_and_the_next_request_claims(redis_client: Any) -> None:
    # fail.lua with a keep of 0 ms: a released Idempotency-Key is not remembered (no ISSUED record)
    store = IdempotencyStore(redis_client)
    key = store.key("alice", "k")
    assert store.begin(key, "fp", "owner-1", lock_seconds=30) == Claimed()
    assert store.release(key, "owner-1") is True
    assert redis_client.exists(key) == 0
    assert store.begin(key, "another-fp", "owner-2", lock_seconds=30) == Claimed()


def test_a_claim_whose_reply_was_lost_is_given_back_to_its_retry(redis_client: Any) -> None:
    # redis-py sends the SET again after a lost reply: it finds this attempt's own claim, and
    # begin.lua hands it back (same owner id, same request id), not a 409 against itself
    store = IdempotencyStore(redis_client)
    key = store.key("alice", "k")
    assert store.begin(key, "fp", "owner-1", lock_seconds=30) == Claimed()
    assert store.begin(key, "fp", "owner-1", lock_seconds=30) == Claimed()
    in_progress = store.begin(key, "fp", "owner-2", lock_seconds=30)
    assert isinstance(in_progress, InProgress)
    assert 1 <= in_progress.retry_after_seconds <= 30
    assert store.begin(key, "other-fp", "owner-2", lock_seconds=30) == Mismatch()


def test_a_stored_response_is_only_refused_by_arguments_checked_before_writing(redis_client: Any) -> None:
    # fail.lua's keep of 0 ms is for a release only: a terminal failure kept 0 ms is refused
    store = IdempotencyStore(redis_client)
    key = store.key("alice", "k")
    owner = "owner-1"
    assert store.begin(key, "fp", owner, lock_seconds=30) == Claimed()
    before = redis_client.get(key)
    reply = redis_client.eval(lua_source("fail"), 1, key, owner, "0", "null", "0", "")
    assert reply[0] == b"invalid_argument"
    reply = redis_client.eval(lua_source("complete"), 1, key, owner, "x", "0", "")
    assert reply[0] == b"invalid_argument"
    assert redis_client.get(key) == before


def test_simultaneous_repeats_run_the_request_once(redis_client: Any) -> None:
    app = orders_app(redis_client, lock_seconds=30)
    assert app.test_client().get("/orders").status_code == 200  # routing compiled before the threads
    barrier = threading.Barrier(8)
    answers: list[Any] = []

    def send() -> None:
        barrier.wait()
        answers.append(post(app, {"item": "book"}))

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(app.config["runs"]) == 1
    fresh = [a for a in answers if a.status_code == 201 and "Idempotent-Replayed" not in a.headers]
    assert len(fresh) == 1
    for answer in answers:
        if answer.status_code == 201:
            assert answer.get_data() == fresh[0].get_data()
        else:
            assert answer.status_code == 409


def test_a_key_without_a_client_identity_is_refused(redis_client: Any) -> None:
    app = orders_app(redis_client)
    anonymous = {"Idempotency-Key": KEY}
    for _ in range(2):
        response = app.test_client().post("/orders", json={"item": "book"}, headers=anonymous)
        assert response.status_code == 400
        assert response.mimetype == "application/problem+json"
        assert response.get_json()["code"] == "idempotency_identity_required"
    assert app.config["runs"] == []  # never shared between unidentified clients
    assert app.test_client().post("/orders", json={"item": "book"}).status_code == 400  # no key either


def test_an_explicit_identity_decides_who_shares_keys(redis_client: Any) -> None:
    app = orders_app(redis_client, identity=lambda environ: environ.get("HTTP_X_USER"))
    first = app.test_client().post("/orders", json={"n": 1}, headers={"Idempotency-Key": KEY, "X-User": "u1"})
    again = app.test_client().post(
        "/orders",
        json={"n": 1},
        headers={"Idempotency-Key": KEY, "X-User": "u1", "Authorization": "Bearer new"},
    )
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.headers["Idempotent-Replayed"] == "true"  # a refreshed credential keeps the namespace
    nobody = app.test_client().post("/orders", json={"n": 1}, headers={"Idempotency-Key": KEY})
    assert nobody.status_code == 400
    assert len(app.config["runs"]) == 1


@pytest.mark.parametrize("option", ["lock_seconds", "ttl_seconds"])
@pytest.mark.parametrize("value", [0.5, 0, -1, True, "60"])
def test_lock_and_ttl_must_be_positive_whole_seconds(redis_client: Any, option: str, value: Any) -> None:
    with pytest.raises(ValueError, match=option):
        orders_app(redis_client, **{option: value})


def test_a_record_the_store_refuses_is_problem_json_not_500(redis_client: Any) -> None:
    app = orders_app(redis_client)
    record = IdempotencyStore(redis_client).key("Bearer alice", KEY.strip('"'))
    redis_client.set(record, b"not a record")
    response = post(app, {"item": "book"})
    assert response.status_code == 503
    assert response.mimetype == "application/problem+json"
    assert response.get_json()["code"] == "store_unavailable"
    assert app.config["runs"] == []


def post_raw(app: Flask, raw: bytes, key: str = KEY) -> Any:
    headers = {"Authorization": "Bearer alice", "Idempotency-Key": key, "Content-Type": "application/json"}
    return app.test_client().post("/orders", data=raw, headers=headers)


def test_the_same_json_with_keys_reordered_is_replayed_not_422(redis_client: Any) -> None:
    app = orders_app(redis_client)
    first = post_raw(app, b'{"item":"book","qty":2,"ship":{"to":"Oslo","by":"air"}}')
    assert first.status_code == 201
    again = post_raw(app, b'{ "ship": {"by": "air", "to": "Oslo"},\n  "qty": 2, "item": "book" }')
    assert again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.get_data() == first.get_data()
    assert post_raw(app, b'{"item":"book","qty":3,"ship":{"to":"Oslo","by":"air"}}').status_code == 422
    assert len(app.config["runs"]) == 1


@pytest.mark.parametrize("status", [408, 409, 425, 429, 500, 503])
def test_transient_answers_are_not_stored_and_free_the_key(redis_client: Any, status: int) -> None:
    app = orders_app(redis_client)
    for _ in range(2):
        response = post(app, {"status": status})
        assert response.status_code == status
        assert "Idempotent-Replayed" not in response.headers
    assert redis_client.keys("ts:ik:*") == []
    assert len(app.config["runs"]) == 2


@pytest.mark.parametrize("status", [200, 202, 303, 400, 404, 422])
def test_final_answers_are_stored_and_replayed(redis_client: Any, status: int) -> None:
    app = orders_app(redis_client)
    assert post(app, {"status": status}).status_code == status
    again = post(app, {"status": status})
    assert again.status_code == status
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.get_json() == {"status": status}
    assert len(app.config["runs"]) == 1


def test_which_statuses_are_stored_is_configurable(redis_client: Any) -> None:
    app = orders_app(redis_client, store_status=lambda status: 200 <= status < 300 or status == 503)
    assert post(app, {"status": 404}).status_code == 404
    assert "Idempotent-Replayed" not in post(app, {"status": 404}).headers
    assert post(app, {"status": 503}, key='"k2"').status_code == 503
    assert post(app, {"status": 503}, key='"k2"').headers["Idempotent-Replayed"] == "true"
    assert len(app.config["runs"]) == 3


def test_a_stream_over_the_cap_passes_through_and_is_stored_omitted(redis_client: Any) -> None:
    app = orders_app(redis_client, max_stored_bytes=2500)
    first = post(app, {"stream": 10})
    assert first.status_code == 200
    assert first.get_data() == b"x" * 10_000
    again = post(app, {"stream": 10})
    assert again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["Idempotent-Body-Omitted"] == "10000"
    assert again.headers["Content-Type"] == "application/octet-stream"
    assert again.get_data() == b""
    # a stream under the cap is kept whole
    small = post(app, {"stream": 2}, key='"k2"')
    assert small.get_data() == b"x" * 2000
    assert post(app, {"stream": 2}, key='"k2"').get_data() == b"x" * 2000
    assert len(app.config["runs"]) == 2


def test_a_stream_that_breaks_frees_the_key(redis_client: Any) -> None:
    app = orders_app(redis_client)
    with pytest.raises(RuntimeError, match="broke"):
        post(app, {"stream": 5, "break_at": 3}).get_data()
    assert redis_client.keys("ts:ik:*") == []
    assert post(app, {"stream": 5}).status_code == 200
    assert len(app.config["runs"]) == 2


def test_duplicates_that_wait_all_get_the_first_response(redis_client: Any) -> None:
    app = orders_app(redis_client, lock_seconds=30, wait_seconds=20)
    assert app.test_client().get("/orders").status_code == 200  # routing compiled before the threads
    gate = threading.Event()
    app.config["gate"] = gate
    answers: list[Any] = []

    def send() -> None:
        response = post(app, {"item": "book"})
        response.get_data()
        answers.append(response)

    threads = [threading.Thread(target=send) for _ in range(6)]
    for thread in threads:
        thread.start()
    wait_until(lambda: app.config["runs"], what="the first request to run")
    time.sleep(0.2)  # the others are polling by now (or arrive later: the same answer either way)
    gate.set()
    for thread in threads:
        thread.join()
    assert len(app.config["runs"]) == 1
    assert [a.status_code for a in answers] == [201] * 6
    assert len({a.get_data() for a in answers}) == 1
    assert sum("Idempotent-Replayed" not in a.headers for a in answers) == 1


@pytest.mark.parametrize("value", [-1, "1", True, float("nan")])
def test_wait_seconds_must_be_a_number_of_seconds(redis_client: Any, value: Any) -> None:
    with pytest.raises(ValueError, match="wait_seconds"):
        orders_app(redis_client, wait_seconds=value)


def test_a_record_written_by_the_earlier_fingerprint_is_still_replayed(redis_client: Any) -> None:
    import base64
    import hashlib

    app = orders_app(redis_client)
    raw = b'{"item": "book"}'
    # what versions before the shared fingerprint wrote: method, path, query and raw body, base64url
    digest = hashlib.sha256(b"POST\n/orders\n\n" + raw).digest()
    legacy = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    store = IdempotencyStore(redis_client)
    record = store.key("Bearer alice", KEY.strip('"'))
    # (in the format of before 0.2.0, the only one a version that old wrote)
    redis_client.set(record, b"D" + legacy.encode() + b"\x1f" + StoredResponse(201, b'{"order":7}').encode())
    replay = post_raw(app, raw)
    assert replay.status_code == 201
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.get_data() == b'{"order":7}'
    # another request under that key is still a mismatch, and nothing ran
    assert post_raw(app, b'{"item": "lamp"}').status_code == 422
    assert app.config["runs"] == []


def test_the_options_are_one_value_and_an_option_given_by_name_wins(redis_client: Any) -> None:
    from token_service.client import asgi
    from token_service.client.wsgi import IdempotencyOptions

    options = IdempotencyOptions(methods=("put",), required=False, lock_seconds=5)
    app = orders_app(redis_client, options=options, required=True)
    core = app.wsgi_app.core  # type: ignore[attr-defined]
    assert (core.options.methods, core.options.required, core.options.lock_seconds) == ({"PUT"}, True, 5)
    assert options.required is False  # the value given is never changed
    # a POST is not guarded now: it runs without a key
    assert app.test_client().post("/orders", json={"n": 1}).status_code == 201
    by_name = asgi.IdempotencyMiddleware(orders_app, redis_client, ttl_seconds=60, header="X-Key")
    assert (by_name.core.options.ttl_seconds, by_name.header_name) == (60, "x-key")
    with pytest.raises(ValueError, match="wait_seconds"):
        IdempotencyOptions(wait_seconds=-1)


@pytest.mark.parametrize("make", ["wsgi", "asgi"])
def test_an_unknown_option_is_a_type_error(redis_client: Any, make: str) -> None:
    from token_service.client import asgi, wsgi

    middleware = wsgi.IdempotencyMiddleware if make == "wsgi" else asgi.IdempotencyMiddleware
    with pytest.raises(TypeError, match="ttl_second"):
        middleware(orders_app, redis_client, ttl_second=60)  # type: ignore[call-arg]


def test_the_three_refusals_of_a_key_are_classes_of_the_error_tree_and_keep_their_bytes() -> None:
    # codes, statuses and titles declared once, in token_service/errors.py; the answers byte for byte
    # what the middlewares have always sent (the parity and Django tests compare whole responses)
    import fakeredis

    from token_service import errors
    from token_service.client._idempotency_core import Answer, IdempotencyCore

    core = IdempotencyCore()
    in_use, reused = core.decide(InProgress(7)), core.decide(Mismatch())
    anonymous = core.attempt(IdempotencyStore(fakeredis.FakeRedis()), "", "k", None)  # type: ignore[arg-type]
    assert isinstance(in_use, Answer)
    assert isinstance(reused, Answer)
    assert isinstance(anonymous, Answer)
    base = b'{"type":"https://token-service.dev/problems/'
    assert (in_use.status, in_use.headers[2], in_use.body) == (
        409,
        ("Retry-After", "7"),
        base + b'idempotency_key_in_use","title":"Request in progress","status":409,"detail":"A request '
        b'with this Idempotency-Key is still being processed; retry later.","code":"idempotency_key_in_use",'
        b'"retry_after_seconds":7}',
    )
    assert (reused.status, reused.body) == (
        422,
        base + b'idempotency_key_mismatch","title":"Idempotency-Key reused","status":422,"detail":"This '
        b'Idempotency-Key was used for a different request.","code":"idempotency_key_mismatch"}',
    )
    assert (anonymous.status, anonymous.body) == (
        400,
        base + b'idempotency_identity_required","title":"Unidentified client","status":400,"detail":"An '
        b'Idempotency-Key is kept per client: send the request with your credentials.","code":'
        b'"idempotency_identity_required"}',
    )
    assert [
        (error.status, error.code, error.title)
        for error in (
            errors.IdempotencyKeyInUse,
            errors.IdempotencyKeyMismatch,
            errors.IdempotencyIdentityRequired,
        )
    ] == [
        (409, "idempotency_key_in_use", "Request in progress"),
        (422, "idempotency_key_mismatch", "Idempotency-Key reused"),
        (400, "idempotency_identity_required", "Unidentified client"),
    ]


def test_a_redis_that_refuses_set_nx_get_claims_in_begin_lua(redis_client: Any) -> None:
    # Redis 6.2 answers SET with both NX and GET with a syntax error: the store claims through
    # begin.lua from then on, the same outcomes in two round trips
    import redis as redis_py

    class OldRedis:
        def __init__(self, client: Any) -> None:
            self.client, self.sets = client, 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self.client, name)

        def execute_command(self, *args: Any, **options: Any) -> Any:
            if args[0] == "SET" and "GET" in args:
                self.sets += 1
                raise redis_py.exceptions.ResponseError("ERR syntax error")
            return self.client.execute_command(*args, **options)

    old = OldRedis(redis_client)
    store = IdempotencyStore(old)
    key = store.key("alice", "k")
    assert store.begin(key, "fp", "owner-1", lock_seconds=30) == Claimed()
    assert isinstance(store.begin(key, "fp", "owner-2", lock_seconds=30), InProgress)
    response = StoredResponse(201, b"done")
    assert store.store(key, "fp", "owner-1", response, ttl_seconds=60) is True
    assert store.begin(key, "fp", "owner-3", lock_seconds=30) == response
    assert store.begin(key, "other", "owner-3", lock_seconds=30) == Mismatch()
    assert old.sets == 1  # asked once, then never again
