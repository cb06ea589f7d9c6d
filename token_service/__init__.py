"""token-service: one-time anti-duplicate-submit tokens behind an HTTP API.

``create_app`` is imported lazily so that ``token_service.client`` (the SDK)
can be imported by services that do not have Flask installed.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "create_app"]

if TYPE_CHECKING:
    from flask import Flask


def create_app(config: Any = None) -> Flask:
    from token_service.config import ConfigError
    from token_service.server.app import create_app as _create_app

    try:
        return _create_app(config)
    except ConfigError as exc:
        if config is None and "gunicorn" in sys.modules:
            # Run as `gunicorn 'token_service:create_app()'` without our config file:
            # gunicorn prints an AppImportError as one line and stops the master,
            # where any other exception would be a traceback and a respawn loop.
            from gunicorn.errors import AppImportError

            raise AppImportError(f"token-service: configuration error: {exc}") from None
        raise
