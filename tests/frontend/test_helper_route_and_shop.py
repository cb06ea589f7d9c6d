"""Without a browser: how the helper is served, and the demo shop over plain HTTP."""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest

from tests.frontend.conftest import RunningDemo
from tests.support.processes import REPO_ROOT

HELPER = "/static/token-client.js"


def test_the_helper_is_served_from_the_package_as_javascript(client: Any) -> None:
    response = client.get(HELPER)
    assert response.status_code == 200
    assert response.mimetype == "text/javascript"
    assert response.data == (REPO_ROOT / "frontend" / "token-client.js").read_bytes()
    assert b"export class TokenClient" in response.data
    assert response.headers["Cache-Control"] == "public, max-age=300, must-revalidate"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert "no-store" not in response.headers["Cache-Control"]


def test_the_helper_revalidates_by_etag(client: Any) -> None:
    etag = client.get(HELPER).headers["ETag"]
    assert etag.startswith('"')
    unchanged = client.get(HELPER, headers={"If-None-Match": etag})
    assert unchanged.status_code == 304
    assert unchanged.data == b""
    stale = client.get(HELPER, headers={"If-None-Match": '"something-else"'})
    assert stale.status_code == 200
    head = client.head(HELPER)
    assert head.status_code == 200
    assert head.data == b""
    assert head.headers["ETag"] == etag


def test_only_the_documented_asset_is_served(client: Any) -> None:
    for path in ("/static/", "/static/other.js", "/static/../api.py", "/static/token-client.js/x"):
        response = client.get(path)
        assert response.status_code == 404, path
        assert response.mimetype == "application/problem+json"


def test_the_helper_may_be_loaded_only_by_allowed_origins(redis_client: Any) -> None:
    from token_service import create_app

    app = create_app(
        {"redis_client": redis_client, "rate_limit": "off", "cors_origins": "http://shop.example"}
    )
    client = app.test_client()
    allowed = client.get(HELPER, headers={"Origin": "http://shop.example"})
    assert allowed.headers["Access-Control-Allow-Origin"] == "http://shop.example"
    assert "Origin" in allowed.headers.get("Vary", "")
    other = client.get(HELPER, headers={"Origin": "http://evil.example"})
    assert "Access-Control-Allow-Origin" not in other.headers


def _token(demo: RunningDemo) -> str:
    response = httpx.post(demo.token_url + "/token/generate", json={"scope": "payment.create"})
    assert response.status_code == 201
    return str(response.json()["token"])


CHARGE = {"amount_cents": 1250, "currency": "EUR", "item": "coffee"}


def test_the_shop_charges_once_per_token_and_replays_the_rest(demo: RunningDemo) -> None:
    token = _token(demo)
    charges = demo.shop_url + "/api/charges"
    first = httpx.post(charges, json=CHARGE, headers={"Idempotency-Token": token})
    assert first.status_code == 201
    assert "Idempotent-Replayed" not in first.headers
    again = httpx.post(charges, json=CHARGE, headers={"Idempotency-Token": token})
    assert again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    other = httpx.post(charges, json=CHARGE, headers={"Idempotency-Token": _token(demo)})
    assert other.status_code == 201
    assert "Idempotent-Replayed" not in other.headers
    listed = httpx.get(charges).json()["charges"]
    assert [charge["id"] for charge in listed] == [first.json()["charge"]["id"], other.json()["charge"]["id"]]


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({}, 400, "invalid_request"),
        ({"Idempotency-Token": "not-a-token-we-issued-0123456789"}, 404, "token_invalid"),
    ],
)
def test_the_shop_refuses_a_charge_without_a_valid_token(
    demo: RunningDemo, headers: dict[str, str], status: int, code: str
) -> None:
    response = httpx.post(demo.shop_url + "/api/charges", json=CHARGE, headers=headers)
    assert response.status_code == status
    assert response.json()["code"] == code
    assert demo.charges() == []


def test_a_rejected_charge_request_does_not_burn_the_token(demo: RunningDemo) -> None:
    token = _token(demo)
    charges = demo.shop_url + "/api/charges"
    bad = httpx.post(charges, json={**CHARGE, "currency": "XXX"}, headers={"Idempotency-Token": token})
    assert bad.status_code == 400
    assert bad.json()["errors"] == {"currency": ["One of EUR, USD, GBP."]}
    good = httpx.post(charges, json=CHARGE, headers={"Idempotency-Token": token})
    assert good.status_code == 201
    assert len(demo.charges()) == 1


def test_the_page_imports_the_helper_from_the_token_service(demo: RunningDemo) -> None:
    page = httpx.get(demo.shop_url + "/").text
    assert f'from "{demo.token_url}/static/token-client.js"' in page
    assert 'id="pay"' in page


def test_one_command_starts_the_whole_demo(tmp_path: Any) -> None:
    import signal
    import subprocess
    import sys

    from tests.support.processes import REPO_ROOT, free_port, wait_until

    token_port, shop_port = free_port(), free_port()
    log = tmp_path / "demo.log"
    env = {key: value for key, value in os.environ.items() if not key.startswith("TOKEN_SERVICE_")}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "examples.checkout",
                "--token-port",
                str(token_port),
                "--shop-port",
                str(shop_port),
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        shop = f"http://127.0.0.1:{shop_port}"
        wait_until(lambda: httpx.get(shop + "/healthz").status_code == 200, what="the demo shop")
        token = httpx.post(
            f"http://127.0.0.1:{token_port}/token/generate",
            json={"scope": "payment.create"},
            headers={"Origin": shop},
        )
        assert token.status_code == 201
        charged = httpx.post(
            shop + "/api/charges", json=CHARGE, headers={"Idempotency-Token": token.json()["token"]}
        )
        assert charged.status_code == 201
        assert f"http://127.0.0.1:{token_port}/static/token-client.js" in httpx.get(shop + "/").text
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0, log.read_text()
    output = log.read_text()
    assert f"shop:          {shop}" in output
    assert "EMBEDDED IN-MEMORY STORE" in output
