"""What the browser tests share: Debian's Chromium, the demo shop behind a fault proxy, request recorders.

The fixtures that start them are in tests/frontend/conftest.py; the tests
import the names from here, never from a conftest.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest
import sqlalchemy as sa

from examples.checkout.demo import DEMO_API_KEY, Demo, Server, token_service_settings
from examples.checkout.shop import charges
from tests.support.processes import wait_until
from tests.support.tcp_proxy import FaultProxy, Mode
from token_service import create_app

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


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} — CI must run the browser tests", pytrace=False)
    pytest.skip(reason)


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
    """The shop, and the token service behind a fault proxy (page and shop both go through it)."""

    demo: Demo
    token_service: Server
    proxy: FaultProxy
    token_requests: Recorder
    shop_requests: Recorder

    @property
    def shop_url(self) -> str:
        return self.demo.shop_url

    @property
    def token_url(self) -> str:
        return self.demo.token_url

    def charges(self, order_id: str | None = None) -> list[dict[str, Any]]:
        """The charges in the shop's database (of one order, or all)."""
        query = sa.select(charges)
        if order_id is not None:
            query = query.where(charges.c.order_id == order_id)
        assert self.demo.engine is not None
        with self.demo.engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(query.order_by(charges.c.id))]

    def token_service_down(self) -> None:
        """Connections refused, open ones reset: the token service is gone for page and shop alike."""
        self.proxy.set_mode(Mode.REFUSE)
        self.proxy.reset_all()
        wait_until(lambda: self.proxy.open_connections == 0, what="the proxy to drop its connections")

    def token_service_up(self) -> None:
        self.proxy.set_mode(Mode.PASS)


def start_demo(**options: Any) -> RunningDemo:
    """A token service on a free port, a fault proxy in front of it, and the shop pointed at the proxy.

    ``shop_origin_listed=False``: the token service's CORS list leaves the shop out (a misconfiguration).
    """
    token_settings = {"rate_limit": "off", **options.pop("token_settings", {})}
    listed = options.pop("shop_origin_listed", True)
    token_service = Server("127.0.0.1", 0)
    proxy = FaultProxy(("127.0.0.1", token_service.wsgi.server_port)).start()
    demo = Demo(
        shop_port=0,
        token_service_url=f"http://127.0.0.1:{proxy.port}",
        charge_delay_seconds=options.pop("charge_delay_seconds", 0.3),
        environ={"CHECKOUT_API_KEY": DEMO_API_KEY},
        **options,
    )
    settings = token_service_settings(
        {}, demo.shop_url if listed else "http://elsewhere.example", token_settings
    )
    token_requests = Recorder(create_app(settings))
    token_service.app = token_requests
    token_service.start()
    demo.start()
    shop_requests = Recorder(demo.shop.app)
    demo.shop.app = shop_requests
    return RunningDemo(demo, token_service, proxy, token_requests, shop_requests)


def stop_demo(running: RunningDemo) -> None:
    running.demo.stop()
    running.proxy.stop()
    running.token_service.stop()
