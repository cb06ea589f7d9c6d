"""The browser snippet of README.md (included in docs/frontend.md and docs/quickstart.md)
in headless Chromium, and docs/frontend.md's command that starts the demo checkout.

The snippet is put, as written, in a page served from the demo shop's origin;
only the module's address is pointed at the demo's token service. The page
provides what the snippet leaves to its reader: the two buttons and ``show``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import httpx
import pytest

from tests.frontend.conftest import RunningDemo
from tests.support.docs import code_blocks
from tests.support.processes import REPO_ROOT, free_port, wait_until

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


def with_page(app: Any, path: str, html: str) -> Any:
    """The WSGI app, answering ``path`` with ``html`` itself."""

    def serve(environ: dict[str, Any], start_response: Any) -> Any:
        if environ["PATH_INFO"] != path:
            return app(environ, start_response)
        start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
        return [html.encode()]

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
    # a page of the shop's origin, so /api/charges is the shop's and tokens come cross-origin
    server = demo.demo.shop_server
    server.app = with_page(server.app, "/readme", PAGE.format(snippet=snippet))
    page.goto(demo.shop_url + "/readme")

    page.dblclick("#payButton")
    first, second = shown(page, 2, errors + console)
    assert sorted([first.split(":")[0], second.split(":")[0]]) == ["Already paid", "Paid"], (first, second)
    assert first.split(": ")[1] == second.split(": ")[1]  # the same charge, shown twice
    assert len(demo.charges()) == 1

    page.click("#newOrderButton")
    page.click("#payButton")
    third = shown(page, 3, errors + console)[2]
    assert third.startswith("Paid: ")
    assert third != first
    assert len(demo.charges()) == 2
    assert errors == []


def test_the_demo_checkout_command_starts_both_servers() -> None:
    [block] = code_blocks("docs/frontend.md", "sh")
    command = block.code.split("#", 1)[0].strip()
    assert command == "make install && .venv/bin/python -m examples.checkout"
    token_port, shop_port = free_port(), free_port()
    command = (
        command.replace(".venv/", f"{sys.prefix}/") + f" --token-port {token_port} --shop-port {shop_port}"
    )
    process = subprocess.Popen(
        ["bash", "-c", command],
        cwd=REPO_ROOT,
        env={**os.environ, "MAKEFLAGS": f"VENV={sys.prefix}"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        for port in (token_port, shop_port):
            url = f"http://127.0.0.1:{port}/healthz"
            wait_until(lambda url=url: httpx.get(url, timeout=1).status_code == 200, 120, 0.2, what=url)
        page = httpx.get(f"http://127.0.0.1:{shop_port}/")
        assert f"http://127.0.0.1:{token_port}/static/token-client.js" in page.text
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
