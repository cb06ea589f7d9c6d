"""Run the whole demo in one process: the token service and the shop, each on its own port.

Two origins on purpose: the page comes from the shop, the tokens (and the JS
helper) from the token service, so the browser does real CORS (a preflight
for ``POST /token/generate``). Both are Werkzeug threaded servers — a demo,
not a deployment; with the embedded store the token service must be one
process anyway.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Mapping
from typing import Any

from werkzeug.serving import BaseWSGIServer, make_server

from examples.checkout.shop import SCOPE, Ledger, create_shop
from token_service import create_app
from token_service.client import TokenClient
from token_service.client.flask import require_token
from token_service.config import Settings

# The shop's key for the token service's backend routes. A demo value: set
# TOKEN_SERVICE_API_KEYS and CHECKOUT_API_KEY for anything else.
DEMO_API_KEY = "demo-shop-key-not-for-production"
# A crashed charge frees its token after this long (the page may then retry it).
LEASE_SECONDS = 10


def _placeholder_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
    return [b"starting\n"]


class Demo:
    """The token service and the shop on ``host`` (ports 0: any free port)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        token_port: int = 8000,
        shop_port: int = 8001,
        *,
        charge_delay_seconds: float = 0.5,
        token_settings: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.host = host
        self.charge_delay_seconds = charge_delay_seconds
        self.token_settings = dict(token_settings or {})
        self.environ = os.environ if environ is None else environ
        # Bind both sockets first: each side must know the other's URL.
        self.token_server: BaseWSGIServer = make_server(host, token_port, _placeholder_app, threaded=True)
        self.shop_server: BaseWSGIServer = make_server(host, shop_port, _placeholder_app, threaded=True)
        self.ledger = Ledger()
        self._threads: list[threading.Thread] = []
        self.client: TokenClient | None = None

    @property
    def token_url(self) -> str:
        return f"http://{self.host}:{self.token_server.server_port}"

    @property
    def shop_url(self) -> str:
        return f"http://{self.host}:{self.shop_server.server_port}"

    def settings(self) -> Settings:
        """The environment's TOKEN_SERVICE_* settings, plus what the demo needs to work."""
        settings = Settings.from_env(self.environ)
        if self.token_settings:
            given = Settings.from_mapping(self.token_settings)
            settings = dataclasses.replace(
                settings, **{name: getattr(given, name.lower()) for name in self.token_settings}
            )
        changes: dict[str, Any] = {}
        if not settings.api_keys:
            changes["api_keys"] = Settings.from_mapping({"api_keys": DEMO_API_KEY}).api_keys
        if self.shop_url not in settings.cors_origins:
            changes["cors_origins"] = (*settings.cors_origins, self.shop_url)
        return dataclasses.replace(settings, **changes)

    def start(self) -> Demo:
        token_app = create_app(self.settings())
        self.token_server.app = token_app
        api_key = self.environ.get("CHECKOUT_API_KEY", DEMO_API_KEY)
        self.shop_server.app = create_shop(
            self._guard(api_key),
            self.token_url,
            charge_delay_seconds=self.charge_delay_seconds,
            ledger=self.ledger,
        )
        for server in (self.token_server, self.shop_server):
            thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.1},  # how soon stop() is noticed
                name=f"demo-{server.server_port}",
            )
            thread.daemon = True
            thread.start()
            self._threads.append(thread)
        return self

    def _guard(self, api_key: str) -> Any:
        # The shop talks to the token service over HTTP with its service key, like any backend.
        self.client = TokenClient(self.token_url, api_key=api_key)
        return require_token(self.client, scope=SCOPE, lease_seconds=LEASE_SECONDS)

    def stop(self) -> None:
        for server in (self.token_server, self.shop_server):
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        if self.client is not None:
            self.client.close()

    def __enter__(self) -> Demo:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
