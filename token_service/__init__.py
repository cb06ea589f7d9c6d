"""token-service: one-time anti-duplicate-submit tokens behind an HTTP API.

``create_app`` is imported lazily so that ``token_service.client`` (the SDK)
can be imported by services that do not have Flask installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"
__all__ = ["__version__", "create_app"]

if TYPE_CHECKING:
    from flask import Flask


def create_app(config: Any = None) -> Flask:
    """The HTTP service (``gunicorn 'token_service:create_app()'``; needs the ``server`` extra).

    See :func:`token_service.server.app.create_app`.
    """
    from token_service.server.app import create_app as _create_app

    return _create_app(config)
