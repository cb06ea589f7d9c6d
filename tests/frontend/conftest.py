"""Fixtures for the browser tests: Debian's Chromium driven by Playwright, and the demo.

Playwright for Python drives the system browser (``/usr/bin/chromium``, from
Debian's ``chromium`` package); it never downloads one. Without the browser
the browser tests skip with the reason — except under CI (``CI`` set), where
a missing browser fails the run instead of passing it silently.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest

from examples.checkout.demo import Demo

CHROMIUM = Path(os.environ.get("TOKEN_SERVICE_CHROMIUM", "/usr/bin/chromium"))
# What works for headless Chromium on these machines (as root, no network but loopback).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} — CI must run the browser tests", pytrace=False)
    pytest.skip(reason)


# Package scope: the browser (and Playwright's event loop) is gone before other packages' asyncio tests.
@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    if not CHROMIUM.is_file():
        _unavailable(f"{CHROMIUM} is missing: apt-get install chromium to run the browser tests")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed: pip install -e '.[dev]'")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def context(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 900, "height": 820})
    context.set_default_timeout(15_000)
    yield context
    context.close()


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)


class Recorder:
    """WSGI middleware that remembers every request a server got (for assertions)."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        self.requests: list[Seen] = []
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        headers = {
            key[5:].replace("_", "-").lower(): value
            for key, value in environ.items()
            if key.startswith("HTTP_")
        }
        with self._lock:
            self.requests.append(Seen(environ["REQUEST_METHOD"], environ["PATH_INFO"], headers))
        return self.app(environ, start_response)

    def where(self, method: str, path: str) -> list[Seen]:
        with self._lock:
            return [seen for seen in self.requests if seen.method == method and seen.path == path]


@dataclass
class RunningDemo:
    demo: Demo
    token_requests: Recorder
    shop_requests: Recorder

    @property
    def shop_url(self) -> str:
        return self.demo.shop_url

    @property
    def token_url(self) -> str:
        return self.demo.token_url

    def charges(self) -> list[dict[str, Any]]:
        return self.demo.ledger.all()


@pytest.fixture
def demo() -> Iterator[RunningDemo]:
    # Ports 0: free ports. The charge takes a little while, so double clicks overlap it.
    running = Demo(
        token_port=0,
        shop_port=0,
        charge_delay_seconds=0.3,
        token_settings={"rate_limit": "off"},
        environ={},
    ).start()
    token_requests = Recorder(running.token_server.app)
    shop_requests = Recorder(running.shop_server.app)
    running.token_server.app = token_requests
    running.shop_server.app = shop_requests
    yield RunningDemo(running, token_requests, shop_requests)
    running.stop()
