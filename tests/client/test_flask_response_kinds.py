"""``@require_token`` with every kind of response: files, streams, HEAD, transient statuses, fields."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from flask import Flask, Response, request, send_file, stream_with_context

from token_service.client import TokenClient
from token_service.client._fingerprint import fields_fingerprint
from token_service.client.flask import require_token

pytestmark = pytest.mark.real
SCOPE = "report.create"
REPORT = b"%PDF-1.4 receipt " * 100  # 1700 bytes


def reports_app(client: TokenClient, **options: Any) -> Flask:
    app = Flask(__name__)
    app.config["calls"] = 0

    @app.route("/reports", methods=["POST", "HEAD"])
    @require_token(client, SCOPE, subject=lambda req: req.headers.get("X-User"), **options)
    def create_report() -> Any:
        app.config["calls"] += 1
        kind = request.args.get("kind", "file")
        if kind == "file":
            return send_file(io.BytesIO(REPORT), mimetype="application/pdf", download_name="r.pdf")
        if kind == "stream":
            size = int(request.args.get("chunks", "3"))

            def chunks() -> Iterator[str]:
                for number in range(size):
                    if request.args.get("break") == str(number):
                        raise RuntimeError("the stream broke")
                    yield "line %04d\n" % number  # noqa: UP031

            return Response(stream_with_context(chunks()), mimetype="text/plain")
        return {"status": int(kind)}, int(kind)

    return app


@pytest.fixture
def client(real_redis: redis.Redis) -> Iterator[TokenClient]:
    with TokenClient.from_redis(real_redis) as sdk:
        yield sdk


def post(app: Flask, token: str, query: str = "", method: str = "POST", **kwargs: Any) -> Any:
    headers = {"Idempotency-Token": token, "X-User": "alice"}
    return app.test_client().open(f"/reports{query}", method=method, headers=headers, **kwargs)


def test_a_file_response_runs_once_and_duplicates_get_it(client: TokenClient) -> None:
    app = reports_app(client)
    token = client.generate(SCOPE, subject="alice").token
    first = post(app, token)
    assert first.status_code == 200
    assert first.get_data() == REPORT
    assert client.verify(token).state == "SUCCEEDED"
    again = post(app, token)
    assert again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.get_data() == REPORT
    assert again.headers["Content-Type"] == "application/pdf"
    assert app.config["calls"] == 1


def test_a_file_over_the_cap_is_recorded_omitted_never_500(client: TokenClient) -> None:
    app = reports_app(client, max_body_bytes=1000)
    token = client.generate(SCOPE, subject="alice").token
    first = post(app, token)
    assert first.status_code == 200
    assert first.get_data() == REPORT
    again = post(app, token)
    assert again.status_code == 200
    assert again.headers["Idempotent-Body-Omitted"] == str(len(REPORT))
    assert again.get_data() == b""
    assert app.config["calls"] == 1


def test_a_head_request_is_recorded_too(client: TokenClient) -> None:
    app = reports_app(client)
    token = client.generate(SCOPE, subject="alice").token
    head = post(app, token, method="HEAD")
    assert head.status_code == 200
    assert head.get_data() == b""
    assert client.verify(token).state == "SUCCEEDED"
    again = post(app, token)
    assert again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert app.config["calls"] == 1


def test_a_stream_is_recorded_as_it_goes_out(client: TokenClient) -> None:
    app = reports_app(client, max_body_bytes=50)
    small = client.generate(SCOPE, subject="alice").token
    assert post(app, small, "?kind=stream&chunks=3").get_data() == b"line 0000\nline 0001\nline 0002\n"
    assert post(app, small, "?kind=stream&chunks=3").get_data() == b"line 0000\nline 0001\nline 0002\n"
    large = client.generate(SCOPE, subject="alice").token
    assert len(post(app, large, "?kind=stream&chunks=20").get_data()) == 200
    again = post(app, large, "?kind=stream&chunks=20")
    assert again.headers["Idempotent-Body-Omitted"] == "200"
    assert app.config["calls"] == 2


def test_a_stream_that_breaks_frees_the_token(client: TokenClient) -> None:
    app = reports_app(client)
    token = client.generate(SCOPE, subject="alice").token
    with pytest.raises(RuntimeError, match="broke"):
        post(app, token, "?kind=stream&chunks=5&break=2").get_data()
    assert client.verify(token).state == "ISSUED"
    assert post(app, token, "?kind=stream&chunks=2").status_code == 200
    assert app.config["calls"] == 2


@pytest.mark.parametrize("status", [408, 409, 425, 429, 503])
def test_transient_statuses_free_the_token(client: TokenClient, status: int) -> None:
    app = reports_app(client)
    token = client.generate(SCOPE, subject="alice").token
    assert post(app, token, f"?kind={status}").status_code == status
    assert client.verify(token).state == "ISSUED"
    assert post(app, token, "?kind=201").status_code == 201
    assert post(app, token, "?kind=201").headers["Idempotent-Replayed"] == "true"
    assert app.config["calls"] == 2


def test_the_store_policy_is_configurable(client: TokenClient) -> None:
    app = reports_app(client, store_status=lambda status: status == 201)
    token = client.generate(SCOPE, subject="alice").token
    assert post(app, token, "?kind=404").status_code == 404
    assert client.verify(token).state == "ISSUED"


def test_a_fingerprint_of_chosen_fields_ignores_order_and_other_fields(client: TokenClient) -> None:
    app = reports_app(client, fingerprint=["amount", "currency"])
    token = client.generate(
        SCOPE, subject="alice", fingerprint=fields_fingerprint({"amount": 100, "currency": "EUR"})
    ).token
    other = post(
        app, token, "?kind=201", data=b'{"amount": 999, "currency": "EUR"}', content_type="application/json"
    )
    assert other.status_code == 403
    first = post(
        app,
        token,
        "?kind=201",
        data=b'{"currency":"EUR","note":"x","amount":100}',
        content_type="application/json",
    )
    assert first.status_code == 201
    assert app.config["calls"] == 1
