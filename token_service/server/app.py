"""The application factory: configuration → Redis client → store → blueprints."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from flask import Flask
from werkzeug.middleware.proxy_fix import ProxyFix

from token_service.config import ConfigError, Settings, unknown_variables
from token_service.connection import redis_client, request_budget_seconds
from token_service.server import (
    admin_api,
    api,
    connections,
    cors,
    embedded,
    frontend,
    health,
    hot_path,
    metrics,
    operations,
    proxies,
    telemetry,
)
from token_service.server.metric_files import multiprocess_dir
from token_service.server.responses import register_error_handlers
from token_service.store import TokenStore

__all__ = ["NO_KEYS_WARNING", "create_app", "load_settings"]

log = logging.getLogger(__name__)

NO_KEYS_WARNING = (
    "TOKEN_SERVICE_API_KEYS is empty: every backend call (consume, begin, complete, fail, "
    "inspect, revoke) is refused with 401 unauthorized. Set at least one service key."
)


def load_settings(config: Settings | Mapping[str, Any] | None) -> Settings:
    if isinstance(config, Settings):
        return config
    if config is None:
        return Settings.from_env(os.environ)
    return Settings.from_mapping(config)


def create_app(config: Settings | Mapping[str, Any] | None = None) -> Flask:
    """The service; ``config`` defaults to the ``TOKEN_SERVICE_*`` environment.

    Run as ``gunicorn 'token_service:create_app()'`` (without our gunicorn
    config), a bad setting or a second worker on the embedded store is
    raised as gunicorn's ``AppImportError``: gunicorn prints it as one line
    and stops, where any other exception would be a traceback and a loop of
    respawned workers.
    """
    try:
        settings = load_settings(config)
        if settings.embedded:
            embedded.guard_one_worker()
    except (ConfigError, embedded.SecondWorker) as exc:
        if embedded.under_gunicorn():
            from gunicorn.errors import AppImportError

            prefix = "token-service: configuration error: " if isinstance(exc, ConfigError) else ""
            raise AppImportError(f"{prefix}{exc}") from None
        raise
    if config is None:
        for message in unknown_variables(os.environ):
            log.warning("configuration: %s", message)
    if not settings.api_keys and not settings.embedded:
        log.warning(NO_KEYS_WARNING)
    if settings.development_warning:
        log.warning(settings.development_warning)
    # No implicit /static route: every route is declared (and documented in openapi.yaml).
    app = proxies.DetectingFlask("token_service", static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    store = TokenStore(
        redis_client(settings),
        key_prefix=settings.key_prefix,
        result_ttl_seconds=settings.result_ttl_seconds,
        observer=metrics.StoreMetrics(settings.metric_scopes),
    )
    app.extensions["token_service"] = {"settings": settings, "store": store}
    register_error_handlers(app)
    telemetry.install(app)
    hot = operations.HotOperations(settings, store)
    app.register_blueprint(api.make_blueprint(settings, store, hot))
    # TRUSTED_PROXY_HOPS=0 and requests with X-Forwarded-For: a proxy nobody declared
    detector = None if settings.trusted_proxy_hops else proxies.ForwardedForDetector(multiprocess_dir())
    app.detector = detector
    app.register_blueprint(
        health.make_blueprint(store, settings.drain_file, detector.warnings if detector else list)
    )
    app.register_blueprint(metrics.make_blueprint())
    app.register_blueprint(admin_api.make_blueprint(settings, store.client))
    app.register_blueprint(frontend.make_blueprint())
    cors.install(app, settings)
    metrics.zero_series(app)
    # generate and consume answered without Flask's per-request machinery (same work, same replies)
    hot_path.install(app, settings, hot)
    if settings.trusted_proxy_hops:
        # X-Forwarded-For is believed for exactly this many proxies in front of us;
        # anything a client wrote further left is ignored.
        app.wsgi_app = ProxyFix(  # type: ignore[method-assign]
            app.wsgi_app, x_for=settings.trusted_proxy_hops, x_proto=settings.trusted_proxy_hops
        )
    # outermost: a body nobody read is read here, or the connection closed after the reply
    # ... and every Redis step of a request within one budget from its first: the worst case
    app.wsgi_app = connections.FinishBody(  # type: ignore[method-assign]
        app.wsgi_app, settings.max_body_bytes, settings.body_timeout_seconds, request_budget_seconds(settings)
    )
    return app
