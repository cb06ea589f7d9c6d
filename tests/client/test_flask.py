"""``@require_token`` on a Flask view, with the token client over every transport."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask, abort, request
from werkzeug.exceptions import NotFound

from tests.support.sdk import Sdk
from token_service.client import TokenClient
from token_service.client.advanced import Started
from token_service.client.flask import current_guard, require_token

SCOPE = "payment.create"


class CardDeclined(Exception):
    pass


def payment_app(client: TokenClient, terminal: Any = (CardDeclined,), **options: Any) -> Flask:
    app = Flask(__name__)
    app.config["calls"] = []

    @app.post("/payments")
    @require_token(
        client,
        SCOPE,
        subject=lambda req: req.headers.get("X-User"),
        terminal=terminal,
        replay_headers=("Content-Type", "Location"),
        **options,
    )
    def pay() -> Any:
        body = request.get_json()
        app.config["calls"].append(body)
        guard = current_guard()
        assert guard is not None
        assert guard.lease is not None
        mode = body.get("mode")
        if mode == "crash":
            raise RuntimeError("bug")
        if mode == "decline":
            raise CardDeclined("insufficient funds")
        if mode == "down":
            return {"error": "bank unavailable"}, 503
        if mode in ("gone", "closed"):
            abort(404 if mode == "gone" else 503)
        if mode == "cjk":
            return "\u4e2d" * 2730, 200, {"Content-Type": "text/plain; charset=utf-8"}
        if mode == "binary":
            return b"\xff\x00\xfe", 200, {"Content-Type": "application/octet-stream"}
        number = len(app.config["calls"])
        headers = {"Location": f"/payments/{number}", "X-Not-Replayed": "1"}
        return {"payment": number, "amount": body["amount"]}, 201, headers

    return app


def post(app: Flask, token: str | None, body: dict[str, Any], user: str = "alice") -> Any:
    headers = {"X-User": user}
    if token is not None:
        headers["Idempotency-Token"] = token
    return app.test_client().post("/payments", json=body, headers=headers)


def test_the_first_request_runs_and_duplicates_get_its_response(sdk: Sdk) -> None:
    app = payment_app(sdk.client)
    token = sdk.client.generate(SCOPE, subject="alice").token
    first = post(app, token, {"amount": 1250})
    assert first.status_code == 201
    assert first.get_json() == {"payment": 1, "amount": 1250}
    assert "Idempotent-Replayed" not in first.headers
    for _ in range(2):
        again = post(app, token, {"amount": 1250})
        assert again.status_code == 201
        assert again.get_data() == first.get_data()
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.headers["Location"] == "/payments/1"
        assert again.headers["Content-Type"] == first.headers["Content-Type"]
        assert "X-Not-Replayed" not in again.headers
    assert len(app.config["calls"]) == 1


def test_binary_bodies_replay_byte_for_byte(sdk: Sdk) -> None:
    app = payment_app(sdk.client)
    token = sdk.client.generate(SCOPE, subject="alice").token
    first = post(app, token, {"mode": "binary"})
    again = post(app, token, {"mode": "binary"})
    assert again.get_data() == first.get_data() == b"\xff\x00\xfe"
    assert again.headers["Content-Type"] == "application/octet-stream"


def test_token_errors_become_problem_json(sdk: Sdk) -> None:
    app = payment_app(sdk.client)
    token = sdk.client.generate(SCOPE, subject="alice").token

    missing = post(app, None, {"amount": 1})
    assert missing.status_code == 400
    assert missing.mimetype == "application/problem+json"
    assert missing.get_json()["code"] == "invalid_request"
    assert "Idempotency-Token" in missing.get_json()["errors"]

    unknown = post(app, "unknown-token-0123456789", {"amount": 1})
    assert (unknown.status_code, unknown.get_json()["code"]) == (404, "token_invalid")

    stolen = post(app, token, {"amount": 1}, user="mallory")
    assert (stolen.status_code, stolen.get_json()["code"]) == (403, "token_mismatch")
    assert stolen.get_json()["field"] == "subject"

    sdk.client.consume(token, SCOPE, subject="alice")
    used = post(app, token, {"amount": 1})
    assert (used.status_code, used.get_json()["code"]) == (409, "token_used")
    assert app.config["calls"] == []


def test_a_request_in_flight_answers_409_with_retry_after(sdk: Sdk) -> None:
    app = payment_app(sdk.client)
    token = sdk.client.generate(SCOPE, subject="alice").token
    assert isinstance(sdk.client.begin(token, SCOPE, subject="alice", lease_seconds=20), Started)
    busy = post(app, token, {"amount": 1})
    assert busy.status_code == 409
    assert busy.get_json()["code"] == "token_in_progress"
    assert 1 <= int(busy.headers["Retry-After"]) <= 20
    assert app.config["calls"] == []


def test_an_exception_or_5xx_frees_the_token_for_a_retry(sdk: Sdk) -> None:
    app = payment_app(sdk.client)
    token = sdk.client.generate(SCOPE, subject="alice").token
    assert post(app, token, {"mode": "crash"}).status_code == 500
    assert sdk.client.verify(token).state == "ISSUED"
    down = post(app, token, {"mode": "down"})
    assert down.status_code == 503
    assert sdk.client.verify(token).state == "ISSUED"
    ok = post(app, token, {"amount": 5})
    assert ok.status_code == 201
    assert post(app, token, {"amount": 5}).headers["Idempotent-Replayed"] == "true"
    assert len(app.config["calls"]) == 3


def test_a_5xx_frees_the_token_even_when_every_exception_is_terminal(sdk: Sdk) -> None:
    app = payment_app(sdk.client, terminal=lambda exc: True)
    token = sdk.client.generate(SCOPE, subject="alice").token
    assert post(app, token, {"mode": "down"}).status_code == 503
    assert sdk.client.verify(token).state == "ISSUED"


def test_an_abort_is_the_response_flask_answers_kept_or_freed_by_its_status(sdk: Sdk) -> None:
    app = payment_app(sdk.client)
    token = sdk.client.generate(SCOPE, subject="alice").token
    first = post(app, token, {"mode": "gone"})
    again = post(app, token, {"mode": "gone"})
    assert (first.status_code, again.status_code) == (404, 404)
    assert b"Not Found" in first.get_data()  # Werkzeug's own page: no error handler in this app
    assert again.get_data() == first.get_data()
    assert again.headers["Content-Type"] == first.headers["Content-Type"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert len(app.config["calls"]) == 1
    # abort(503): answered, and freed as a returned 503 is
    other = sdk.client.generate(SCOPE, subject="alice").token
    assert post(app, other, {"mode": "closed"}).status_code == 503
    assert sdk.client.verify(other).state == "ISSUED"


def test_an_abort_the_app_traps_or_calls_terminal_is_an_exception(sdk: Sdk) -> None:
    trapping = payment_app(sdk.client)
    trapping.config["TRAP_HTTP_EXCEPTIONS"] = True  # Flask raises it as any exception: a 500
    token = sdk.client.generate(SCOPE, subject="alice").token
    assert post(trapping, token, {"mode": "gone"}).status_code == 500
    assert sdk.client.verify(token).state == "ISSUED"
    terminal = payment_app(sdk.client, terminal=(NotFound,))
    token = sdk.client.generate(SCOPE, subject="alice").token
    assert post(terminal, token, {"mode": "gone"}).status_code == 404
    assert post(terminal, token, {"amount": 1}).get_json()["code"] == "token_failed"


def test_a_terminal_exception_is_replayed_as_token_failed(sdk: Sdk) -> None:
    app = payment_app(sdk.client)
    token = sdk.client.generate(SCOPE, subject="alice").token
    assert post(app, token, {"mode": "decline"}).status_code == 500
    again = post(app, token, {"amount": 1})
    assert again.status_code == 409
    problem = again.get_json()
    assert problem["code"] == "token_failed"
    assert problem["error"] == {"type": "CardDeclined", "message": "insufficient funds"}
    assert len(app.config["calls"]) == 1


def test_a_large_body_is_replayed_without_it(sdk: Sdk) -> None:
    app = payment_app(sdk.client, max_body_bytes=10)
    token = sdk.client.generate(SCOPE, subject="alice").token
    first = post(app, token, {"amount": 1})
    assert first.status_code == 201
    again = post(app, token, {"amount": 1})
    assert again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.get_data() == b""
    assert again.headers["Idempotent-Body-Omitted"] == str(len(first.get_data()))
    assert len(app.config["calls"]) == 1


def test_a_body_too_large_once_json_encoded_is_kept_omitted_not_run_twice(sdk: Sdk) -> None:
    # 8190 bytes of UTF-8 (under max_body_bytes) but 16380 + of JSON: "\u4e2d" is 6 bytes
    # the default lease: a 1 s one could run out on a loaded machine before the result is stored
    app = payment_app(sdk.client)
    token = sdk.client.generate(SCOPE, subject="alice").token
    first = post(app, token, {"mode": "cjk"})
    assert first.status_code == 200
    assert first.get_data(as_text=True) == "\u4e2d" * 2730
    assert sdk.client.verify(token).state == "SUCCEEDED"
    again = post(app, token, {"mode": "cjk"})
    assert again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["Idempotent-Body-Omitted"] == str(len(first.get_data()))
    assert again.get_data() == b""
    assert len(app.config["calls"]) == 1


def test_a_small_body_replays_without_the_omitted_marker(sdk: Sdk) -> None:
    app = payment_app(sdk.client)
    token = sdk.client.generate(SCOPE, subject="alice").token
    post(app, token, {"amount": 3})
    assert "Idempotent-Body-Omitted" not in post(app, token, {"amount": 3}).headers


def test_store_down_answers_503() -> None:
    token = "well-formed-token-0123456789"
    dead = TokenClient.from_redis("redis://127.0.0.1:1/0", timeout=0.2, retry=1)
    response = post(payment_app(dead), token, {"amount": 1})
    assert response.status_code == 503
    assert response.get_json()["code"] == "store_unavailable"
    assert "Retry-After" in response.headers


def test_a_wrong_backend_key_fails_closed_with_503_not_500(redis_client: Any) -> None:
    import httpx

    from tests.support.service import API_KEY
    from token_service import create_app

    service = create_app({"api_keys": API_KEY, "redis_client": redis_client, "rate_limit": "off"})
    transport = httpx.WSGITransport(app=service)
    issued = httpx.Client(transport=transport, base_url="http://ts").post(
        "/token/generate", json={"scope": SCOPE}
    )
    token = issued.json()["token"]
    wrong_key = TokenClient(base_url="http://ts", api_key="not-the-key-not-the-key", transport=transport)
    app = payment_app(wrong_key)
    response = app.test_client().post("/payments", json={"amount": 1}, headers={"Idempotency-Token": token})
    assert response.status_code == 503
    assert response.json["code"] == "store_unavailable"
    assert app.config["calls"] == []


def test_every_integration_answers_a_refused_service_key_with_the_same_503(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Flask, FastAPI and Django answer the token service's refusals through this one function
    from token_service.client._stored_response import refusal
    from token_service.errors import ServiceUnavailable, TokenUsed, Unauthorized

    answer = refusal(Unauthorized("bad key"))
    assert isinstance(answer, ServiceUnavailable)
    assert answer.code == "store_unavailable"
    assert "refused this backend's service key" in caplog.text
    used = TokenUsed("used")
    assert refusal(used) is used
