"""Without a browser: how the helper is served, and the demo shop over plain HTTP."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.browser import RunningDemo
from tests.support.processes import REPO_ROOT, free_port, wait_until

# slow: the service and the demo shop as processes (~75 s)
pytestmark = pytest.mark.slow

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


def _shopper(demo: RunningDemo) -> tuple[httpx.Client, str, str]:
    """A shopper's session on the shop: (client with its cookie, order id, shopper id)."""
    shop = httpx.Client(base_url=demo.shop_url, follow_redirects=True, timeout=30)
    order_id = shop.get("/").url.path.rsplit("/", 1)[1]
    order = shop.get(f"/api/orders/{order_id}").json()
    return shop, order_id, order["shopper"]


def _token(demo: RunningDemo, subject: str | None, fingerprint: str | None) -> str:
    response = httpx.post(
        demo.token_url + "/token/generate",
        json={"scope": "payment.create", "subject": subject, "fingerprint": fingerprint},
    )
    assert response.status_code == 201
    return str(response.json()["token"])


def _charge(shop: httpx.Client, order_id: str, token: str | None) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Idempotency-Token"] = token
    return shop.post(f"/api/orders/{order_id}/charge", content="{}", headers=headers)


def test_any_number_of_tokens_for_one_order_charge_it_once(demo: RunningDemo) -> None:
    shop, order_id, shopper = _shopper(demo)
    first = _charge(shop, order_id, _token(demo, shopper, order_id))
    assert first.status_code == 201
    assert "Idempotent-Replayed" not in first.headers
    for _ in range(3):  # a reload, a second tab, a new token: each its own token, the same order
        again = _charge(shop, order_id, _token(demo, shopper, order_id))
        assert again.status_code == 201
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.json() == first.json()
    assert len(demo.charges(order_id)) == 1
    assert shop.get(f"/api/orders/{order_id}").json()["status"] == "paid"
    # A new order is an explicit POST; it is charged on its own.
    created = shop.post("/api/orders")
    assert created.status_code == 201
    other = created.json()["id"]
    assert _charge(shop, other, _token(demo, shopper, other)).status_code == 201
    assert len(demo.charges()) == 2
    listed = shop.get("/api/charges").json()["charges"]
    assert [charge["order_id"] for charge in listed] == [order_id, other]
    stranger, _, _ = _shopper(demo)
    assert stranger.get("/api/charges").json()["charges"] == []  # each shopper sees their own


def test_the_token_is_bound_to_the_order_and_the_shopper(demo: RunningDemo) -> None:
    shop, order_id, shopper = _shopper(demo)
    other_order = shop.post("/api/orders").json()["id"]
    wrong_order = _charge(shop, order_id, _token(demo, shopper, other_order))
    assert wrong_order.status_code == 403
    assert wrong_order.json()["code"] == "token_mismatch"
    intruder, _, _ = _shopper(demo)  # another session, with a token minted for the shopper's order
    stolen = _charge(intruder, order_id, _token(demo, shopper, order_id))
    assert stolen.status_code == 403
    assert stolen.json()["code"] == "token_mismatch"
    assert intruder.get(f"/api/orders/{order_id}").status_code == 404
    assert demo.charges() == []


@pytest.mark.parametrize(
    ("token", "status", "code"),
    [(None, 400, "invalid_request"), ("not-a-token-we-issued-0123456789", 404, "token_invalid")],
)
def test_the_shop_refuses_a_charge_without_a_valid_token(
    demo: RunningDemo, token: str | None, status: int, code: str
) -> None:
    shop, order_id, _ = _shopper(demo)
    response = _charge(shop, order_id, token)
    assert response.status_code == status
    assert response.json()["code"] == code
    assert demo.charges() == []


def test_the_page_bundles_the_helper_and_knows_the_token_service(demo: RunningDemo) -> None:
    shop, order_id, shopper = _shopper(demo)
    page = shop.get(f"/orders/{order_id}")
    assert page.headers["Cache-Control"] == "no-store"
    assert 'from "/static/vendor/token-client.js"' in page.text
    assert f'"tokenService": "{demo.token_url}"' in page.text
    assert shopper in page.text
    bundled = shop.get("/static/vendor/token-client.js")
    assert bundled.headers["Content-Type"].startswith("text/javascript")
    assert bundled.content == (REPO_ROOT / "frontend" / "token-client.js").read_bytes()


def _run_demo(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "examples.checkout", *args],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _stop(process: subprocess.Popen[bytes], log: Path) -> str:
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0, log.read_text()
    return log.read_text()


def _url_in(log: Path, name: str) -> str:
    wait_until(lambda: f"{name}:" in log.read_text() and "Ctrl-C" in log.read_text(), what=f"the {name} line")
    match = re.search(rf"^{name}:\s+(http://\S+)", log.read_text(), re.MULTILINE)
    assert match, log.read_text()
    return match.group(1)


def _clean_env() -> dict[str, str]:
    return {
        key: value for key, value in os.environ.items() if not key.startswith(("TOKEN_SERVICE_", "CHECKOUT_"))
    }


def test_one_command_starts_the_whole_demo_on_free_ports(tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    process = _run_demo([], log, _clean_env())
    try:
        shop_url, token_url = _url_in(log, "shop"), _url_in(log, "token service")
        assert not shop_url.endswith(":8000")
        assert not token_url.endswith(":8000")
        shop = httpx.Client(base_url=shop_url, follow_redirects=True)
        order_id = shop.get("/").url.path.rsplit("/", 1)[1]
        shopper = shop.get(f"/api/orders/{order_id}").json()["shopper"]
        token = httpx.post(
            token_url + "/token/generate",
            json={"scope": "payment.create", "subject": shopper, "fingerprint": order_id},
            headers={"Origin": shop_url},
        )
        assert token.headers["Access-Control-Allow-Origin"] == shop_url
        assert _charge(shop, order_id, token.json()["token"]).status_code == 201
    finally:
        output = _stop(process, log)
    assert "EMBEDDED IN-MEMORY STORE" in output
    assert "database:      sqlite:///" in output


def test_the_demo_uses_an_already_running_token_service(tmp_path: Path) -> None:
    shop_port = free_port()
    shop_origin = f"http://127.0.0.1:{shop_port}"
    service_log = tmp_path / "service.log"
    env = {
        **_clean_env(),
        "TOKEN_SERVICE_API_KEYS": "running-service-key-0123456789",
        "TOKEN_SERVICE_CORS_ORIGINS": shop_origin,
    }
    token_port = free_port()
    with service_log.open("wb") as out:
        service = subprocess.Popen(
            [str(Path(sys.executable).with_name("token-service")), "serve", "--port", str(token_port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    token_url = f"http://127.0.0.1:{token_port}"
    try:
        wait_until(lambda: _up(token_url + "/healthz"), what="the token service")
        log = tmp_path / "demo.log"
        shop_env = {**_clean_env(), "CHECKOUT_API_KEY": "running-service-key-0123456789"}
        process = _run_demo(["--token-service", token_url, "--shop-port", str(shop_port)], log, shop_env)
        try:
            assert _url_in(log, "shop") == shop_origin
            shop = httpx.Client(base_url=shop_origin, follow_redirects=True)
            order_id = shop.get("/").url.path.rsplit("/", 1)[1]
            shopper = shop.get(f"/api/orders/{order_id}").json()["shopper"]
            token = httpx.post(
                token_url + "/token/generate",
                json={"scope": "payment.create", "subject": shopper, "fingerprint": order_id},
            )
            assert _charge(shop, order_id, token.json()["token"]).status_code == 201
        finally:
            output = _stop(process, log)
        assert f"token service: {token_url}  (yours)" in output
        assert "warning" not in output
        assert "EMBEDDED" not in output  # no token service of its own

        # A shop whose origin the service does not list, with a key it refuses, is told both at start.
        other_log = tmp_path / "other.log"
        wrong_key = {**shop_env, "CHECKOUT_API_KEY": "not-a-key-of-this-service"}
        other = _run_demo(["--token-service", token_url], other_log, wrong_key)
        try:
            wait_until(lambda: "Ctrl-C" in other_log.read_text(), what="the demo's start")
        finally:
            output = _stop(other, other_log)
        assert "does not allow the origin" in output
        assert "TOKEN_SERVICE_CORS_ORIGINS" in output
        assert "refuses the shop's service key: set CHECKOUT_API_KEY" in output
        assert output.count("warning:") == 2
    finally:
        service.send_signal(signal.SIGTERM)
        service.wait(timeout=20)


def _up(url: str) -> bool:
    try:
        return httpx.get(url).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_demos_own_token_service_takes_the_shops_key_whatever_the_environment() -> None:
    from examples.checkout.demo import DEMO_API_KEY, token_service_settings
    from token_service.config import Settings

    def digests(keys: str) -> set[str]:
        return set(Settings.from_mapping({"api_keys": keys}).api_keys)

    shop = "http://127.0.0.1:5555"
    assert set(token_service_settings({}, shop).api_keys) == digests(DEMO_API_KEY)
    # TOKEN_SERVICE_API_KEYS exported for something else, no CHECKOUT_API_KEY: both keys work.
    mixed = token_service_settings({"TOKEN_SERVICE_API_KEYS": "another-key-0123456789"}, shop)
    assert set(mixed.api_keys) == digests(f"another-key-0123456789,{DEMO_API_KEY}")
    own = token_service_settings({}, shop, shop_api_key="the-shops-own-key-0123")
    assert set(own.api_keys) == digests("the-shops-own-key-0123")
    assert shop in own.cors_origins
    # make run's development key (the Makefile's) is the shop's default: `--token-service` works against it.
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert f"DEV_API_KEY := {DEMO_API_KEY}\n" in makefile
    assert "TOKEN_SERVICE_API_KEYS=$${TOKEN_SERVICE_API_KEYS-$(DEV_API_KEY)}" in makefile
