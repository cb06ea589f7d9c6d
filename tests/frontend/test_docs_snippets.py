"""The browser snippet of README.md (included in docs/frontend.md and docs/quickstart.md)
in headless Chromium, and docs/frontend.md's commands that start the demo checkout (alone,
and beside ``make run``).

The snippet is put, as written, in a page served from the demo shop's origin;
only the module's address is pointed at the demo's token service. The page
provides what the snippet leaves to its reader: the two buttons and ``show``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from flask import Flask, Response, jsonify, request

from examples.checkout.shop import charges as shop_charges
from tests.support.browser import RunningDemo
from tests.support.docs import code_blocks, make_here
from tests.support.processes import REPO_ROOT, free_port, wait_until
from token_service.client.flask import require_token

pytestmark = pytest.mark.slow

DOCUMENTED_MODULE = "https://tokens.example.com/static/token-client.js"
PAGE = """<!doctype html>
<button id="payButton">Pay</button> <button id="newOrderButton">New order</button>
<ul id="shown"></ul>
<script>
  function show(text) {{
    const item = document.createElement("li");
    item.textContent = text;
    document.getElementById("shown").append(item);
  }}
</script>
{snippet}
"""


def snippet_backend(demo: RunningDemo, html: str, charges: list[dict[str, Any]]) -> Flask:
    """What the snippet expects of its page's origin: the page, and ``POST /api/charges`` behind the guard.

    (The demo shop charges orders, not requests; the snippet is the smallest use of the helper.)
    """
    assert demo.demo.client is not None
    app = Flask(__name__)

    @app.get("/readme")
    def page() -> str:
        return html

    @app.post("/api/charges")
    @require_token(demo.demo.client, scope="payment.create")
    def charge() -> tuple[Response, int]:
        time.sleep(0.3)  # a slow payment provider: the double click overlaps it
        charges.append({"id": f"ch_{len(charges) + 1:04d}", **(request.get_json() or {})})
        return jsonify(charge=charges[-1]), 201

    return app


def on_paths(app: Any, paths: set[str], other: Any) -> Any:
    def serve(environ: dict[str, Any], start_response: Any) -> Any:
        return (app if environ["PATH_INFO"] in paths else other)(environ, start_response)

    return serve


def shown(page: Any, count: int, errors: list[str]) -> list[str]:
    try:
        page.wait_for_function("n => document.querySelectorAll('#shown li').length >= n", arg=count)
    except Exception:
        raise AssertionError(f"the page showed {page.inner_text('#shown')!r}; errors: {errors}") from None
    page.wait_for_timeout(300)  # a late extra line would be a bug: give it the time to show
    return [item.inner_text() for item in page.locator("#shown li").all()]


def test_the_readme_browser_snippet_charges_once_per_order(context: Any, demo: RunningDemo) -> None:
    [block] = code_blocks("README.md", "html")
    assert DOCUMENTED_MODULE in block.code
    snippet = block.code.replace(DOCUMENTED_MODULE, demo.token_url + "/static/token-client.js")
    page = context.new_page()
    errors: list[str] = []  # uncaught exceptions: none expected
    console: list[
        str
    ] = []  # the browser's own lines (a 409 while the first charge runs is one), for failures
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: console.append(message.text))
    # a page of the shop's origin (the one the token service allows), tokens come cross-origin
    charges: list[dict[str, Any]] = []
    backend = snippet_backend(demo, PAGE.format(snippet=snippet), charges)
    demo.demo.shop.app = on_paths(backend, {"/readme", "/api/charges"}, demo.demo.shop.app)
    page.goto(demo.shop_url + "/readme")

    page.dblclick("#payButton")
    first, second = shown(page, 2, errors + console)
    assert sorted([first.split(":")[0], second.split(":")[0]]) == ["Already paid", "Paid"], (first, second)
    assert first.split(": ")[1] == second.split(": ")[1]  # the same charge, shown twice
    assert len(charges) == 1

    page.click("#newOrderButton")
    page.click("#payButton")
    third = shown(page, 3, errors + console)[2]
    assert third.startswith("Paid: ")
    assert third != first
    assert len(charges) == 2
    assert errors == []


def test_the_bundling_snippets_install_and_get_a_token(tmp_path: Path, demo: RunningDemo) -> None:
    install, _, _ = code_blocks("docs/frontend.md", "sh")
    command = install.code.split("#", 1)[0].strip()
    assert command == "npm install /path/to/token-service/frontend"
    shop = tmp_path / "shop"
    shop.mkdir()
    (shop / "package.json").write_text('{"name": "shop", "private": true, "type": "module"}')
    npm = shutil.which("npm")
    node = shutil.which("node")
    if npm is None or node is None:
        if os.environ.get("CI"):
            pytest.fail("node and npm are missing — CI must run this", pytrace=False)
        pytest.skip("node and npm are missing (apt-get install nodejs npm)")
    command = command.replace("/path/to/token-service", str(REPO_ROOT)).replace(
        "npm install", "npm install --offline"
    )
    done = subprocess.run(["bash", "-c", command], cwd=shop, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    [block] = code_blocks("docs/frontend.md", "js")
    script = (
        'const shopperId = "shopper-1", orderId = "ord_1";\n'
        + block.code.replace("https://tokens.example.com", demo.token_url)
        + "\nconsole.log(JSON.stringify({ token: await order.token(), renewals: order.renewals }));\n"
    )
    (shop / "checkout.mjs").write_text(script)
    run = subprocess.run([node, "checkout.mjs"], cwd=shop, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert len(json.loads(run.stdout)["token"]) >= 22
    assert len(demo.token_requests.where("POST", "/token/generate")) == 1  # one token, fetched once


def test_the_demo_checkout_command_starts_the_shop_and_a_token_service(tmp_path: Path) -> None:
    _, block, _ = code_blocks("docs/frontend.md", "sh")
    command = block.code.split("#", 1)[0].strip()
    assert command == "make install && .venv/bin/python -m examples.checkout"
    command = make_here(command.replace(".venv/", f"{sys.prefix}/"))
    log = tmp_path / "demo.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["bash", "-c", command],
            cwd=REPO_ROOT,
            env={**os.environ, "MAKEFLAGS": f"VENV={sys.prefix}"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(lambda: "Ctrl-C" in log.read_text(), 120, 0.2, what="the demo")
        shop = re.search(r"^shop:\s+(\S+)", log.read_text(), re.MULTILINE)
        token_service = re.search(r"^token service:\s+(\S+)", log.read_text(), re.MULTILINE)
        assert shop, log.read_text()
        assert token_service, log.read_text()
        page = httpx.get(shop.group(1) + "/", follow_redirects=True)
        assert f'"tokenService": "{token_service.group(1)}"' in page.text
        assert httpx.get(token_service.group(1) + "/healthz").status_code == 200
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def _clean_env() -> dict[str, str]:
    """A newcomer's shell: none of the service's or the shop's settings."""
    return {
        key: value for key, value in os.environ.items() if not key.startswith(("TOKEN_SERVICE_", "CHECKOUT_"))
    }


def test_the_demo_checkout_beside_make_run_charges_once_in_chromium(context: Any, tmp_path: Path) -> None:
    """The two commands as a newcomer types them: make run, then the demo pointed at it; pay, reload."""
    _, _, block = code_blocks("docs/frontend.md", "sh")
    make_run, demo_command = (line.split("#", 1)[0].strip() for line in block.code.strip().splitlines())
    assert make_run == "TOKEN_SERVICE_CORS_ORIGINS=http://127.0.0.1:8100 make run"
    assert demo_command == (
        ".venv/bin/python -m examples.checkout --token-service http://127.0.0.1:8000 --shop-port 8100"
    )
    token_port, shop_port = free_port(), free_port()
    shop_url = f"http://127.0.0.1:{shop_port}"
    database = tmp_path / "shop.sqlite3"
    # The documented ports made free ones; `make run` takes its port from PORT (8000 by default).
    make_run = make_here(make_run.replace(":8100", f":{shop_port}"))
    demo_command = (
        demo_command.replace(":8000", f":{token_port}")
        .replace("8100", str(shop_port))
        .replace(".venv/", f"{sys.prefix}/")
    ) + f" --database sqlite:///{database}"  # so the test can count the charges in the shop's database
    env = {**_clean_env(), "PORT": str(token_port), "MAKEFLAGS": f"VENV={sys.prefix}"}
    processes: list[subprocess.Popen[bytes]] = []

    def start(command: str, log: Path) -> None:
        with log.open("wb") as out:
            processes.append(
                subprocess.Popen(
                    ["bash", "-c", command],
                    cwd=REPO_ROOT,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    service_log, demo_log = tmp_path / "service.log", tmp_path / "demo.log"
    try:
        start(make_run, service_log)
        health = f"http://127.0.0.1:{token_port}/healthz"
        wait_until(lambda: _answers(health), 120, 0.2, what="make run's token service")
        start(demo_command, demo_log)
        wait_until(lambda: "Ctrl-C" in demo_log.read_text(), 120, 0.2, what="the demo")
        assert "warning" not in demo_log.read_text()  # the origin is listed, make run takes the shop's key
        assert f"shop:          {shop_url}" in demo_log.read_text()

        page = context.new_page()
        page.goto(shop_url + "/")
        page.wait_for_selector("#status[data-state='ready']")
        page.click("#pay")
        page.wait_for_selector("#status[data-state='paid']")
        order_id = page.locator("#order").inner_text()
        page.reload()
        page.wait_for_selector("#status[data-state='paid']")
        assert page.locator("#pay").is_disabled()
        engine = sa.create_engine(f"sqlite:///{database}")
        try:
            with engine.connect() as conn:
                rows = conn.execute(sa.select(shop_charges.c.order_id)).all()
        finally:
            engine.dispose()
        assert [row.order_id for row in rows] == [order_id]
    finally:
        for process in reversed(processes):
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url).status_code == 200
    except httpx.HTTPError:
        return False
