"""The demo in one process: the shop, and (unless you point it at one) a token service.

Two origins on purpose: the page comes from the shop, the tokens from the
token service, so the browser does real CORS (a preflight for ``POST
/token/generate``). Both are Werkzeug threaded servers — a demo, not a
deployment; with the embedded store the token service must be one process
anyway. Ports default to 0: any free port, so the demo never clashes with
``make run`` on 8000.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from werkzeug.serving import BaseWSGIServer, make_server

from examples.checkout.shop import SCOPE, create_database, create_shop
from token_service import create_app
from token_service.client import TokenClient
from token_service.client.flask import require_token
from token_service.config import Settings

# The shop's key for the token service's backend routes when CHECKOUT_API_KEY is not set:
# the development key `make run` sets (Makefile), so `--token-service` pointed at `make run`
# works as it is. A demo value: set TOKEN_SERVICE_API_KEYS and CHECKOUT_API_KEY for anything else.
DEMO_API_KEY = "dev-service-key-change-me"
# A crashed charge frees its token after this long (the page may then retry it).
LEASE_SECONDS = 10


def _placeholder_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
    return [b"starting\n"]


class Server:
    """A Werkzeug threaded server on ``host:port`` (0: a free port), bound at once, served by start()."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.wsgi: BaseWSGIServer = make_server(host, port, _placeholder_app, threaded=True)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.wsgi.server_port}"

    @property
    def app(self) -> Callable[..., Any]:
        return self.wsgi.app  # type: ignore[no-any-return]

    @app.setter
    def app(self, app: Callable[..., Any]) -> None:
        self.wsgi.app = app  # type: ignore[assignment]

    def start(self) -> Server:
        self._thread = threading.Thread(
            target=self.wsgi.serve_forever,
            kwargs={"poll_interval": 0.1},  # how soon stop() is noticed
            name=f"demo-{self.wsgi.server_port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self.wsgi.shutdown()
            self._thread.join(timeout=5)
        self.wsgi.server_close()


def token_service_settings(
    environ: Mapping[str, str],
    shop_url: str,
    overrides: Mapping[str, Any] | None = None,
    shop_api_key: str = DEMO_API_KEY,
) -> Settings:
    """The environment's TOKEN_SERVICE_* settings, plus what the demo needs: the shop's key, its origin."""
    settings = Settings.from_env(environ)
    if overrides:
        given = Settings.from_mapping(dict(overrides))
        settings = dataclasses.replace(settings, **{name: getattr(given, name.lower()) for name in overrides})
    changes: dict[str, Any] = {}
    # The shop's key is accepted even when TOKEN_SERVICE_API_KEYS names others (and CHECKOUT_API_KEY none).
    [shop_key_digest] = Settings.from_mapping({"api_keys": shop_api_key}).api_keys
    if shop_key_digest not in settings.api_keys:
        changes["api_keys"] = (*settings.api_keys, shop_key_digest)
    if shop_url not in settings.cors_origins:
        changes["cors_origins"] = (*settings.cors_origins, shop_url)
    return dataclasses.replace(settings, **changes)


class Demo:
    """The shop on ``host:shop_port``; the token service at ``token_service_url``, else one started here."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        shop_port: int = 0,
        *,
        token_service_url: str | None = None,
        token_port: int = 0,
        database_url: str | None = None,
        charge_delay_seconds: float = 0.5,
        token_ttl_seconds: int | None = None,
        token_settings: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.host = host
        self.charge_delay_seconds = charge_delay_seconds
        self.token_ttl_seconds = token_ttl_seconds
        self.token_settings = dict(token_settings or {})
        self.environ = os.environ if environ is None else environ
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if database_url is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="checkout-")
            database_url = f"sqlite:///{Path(self._tmp.name) / 'shop.sqlite3'}"
        self.database_url = database_url
        # Bind the sockets first: each side must know the other's URL.
        self.shop = Server(host, shop_port)
        self.token_service = None if token_service_url else Server(host, token_port)
        self._token_service_url = token_service_url
        self.engine: sa.Engine | None = None
        self.client: TokenClient | None = None

    @property
    def token_url(self) -> str:
        if self.token_service is not None:
            return self.token_service.url
        assert self._token_service_url is not None
        return self._token_service_url.rstrip("/")

    @property
    def shop_url(self) -> str:
        return self.shop.url

    @property
    def api_key(self) -> str:
        """The shop's key for the token service: CHECKOUT_API_KEY, else ``make run``'s development key."""
        return self.environ.get("CHECKOUT_API_KEY") or DEMO_API_KEY

    def start(self) -> Demo:
        api_key = self.api_key
        if self.token_service is not None:
            settings = token_service_settings(self.environ, self.shop_url, self.token_settings, api_key)
            self.token_service.app = create_app(settings)
        self.engine = create_database(self.database_url)
        # The shop talks to the token service over HTTP with its service key, like any backend.
        self.client = client = TokenClient(self.token_url, api_key=api_key)

        def guard(**bindings: Any) -> Any:
            return require_token(client, scope=SCOPE, lease_seconds=LEASE_SECONDS, **bindings)

        self.shop.app = create_shop(
            guard,
            self.token_url,
            self.engine,
            charge_delay_seconds=self.charge_delay_seconds,
            token_ttl_seconds=self.token_ttl_seconds,
        )
        for server in (self.token_service, self.shop):
            if server is not None:
                server.start()
        return self

    def stop(self) -> None:
        for server in (self.token_service, self.shop):
            if server is not None:
                server.stop()
        if self.client is not None:
            self.client.close()
        if self.engine is not None:
            self.engine.dispose()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> Demo:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
