"""CORS for the frontend-facing routes only, for an explicit list of origins.

Browsers on the configured origins may call the routes the route table marks
``browser``: ask for tokens (``/token/generate``, ``/token/generate/batch``)
and load the frontend helper (``/static/token-client.js``).
Nothing else answers a cross-origin request: the backend routes carry no
CORS headers at all, so a page can never drive them from a user's browser.
Origins are compared exactly (compiled, escaped patterns: flask-cors would
otherwise read an origin containing ``[`` as a regular expression), and the
only Origin ever echoed is one on the list. No credentials: a token request
needs none, and without them a cross-site page learns nothing it could not
get by asking itself.
"""

from __future__ import annotations

import re

from flask import Flask, Response, request
from flask_cors import CORS

from token_service.config import Settings
from token_service.server.routes import ROUTES

__all__ = ["ALLOWED_HEADERS", "BROWSER_PATHS", "EXPOSED_HEADERS", "install"]

BROWSER_PATHS = tuple(re.compile(re.escape(route.path) + r"\Z") for route in ROUTES if route.browser)
# What the frontend helper sends: JSON bodies, its request id, and the token
# header it attaches to the application's own requests.
ALLOWED_HEADERS = ["Content-Type", "Idempotency-Token", "X-Request-ID"]
# A script must be able to read how long to wait after a 429, and the request id for support.
EXPOSED_HEADERS = ["Retry-After", "X-Request-ID"]


def install(app: Flask, settings: Settings) -> None:
    if not settings.cors_origins:
        return  # no origin configured: same-origin only, no CORS headers anywhere
    origins = [re.compile(re.escape(origin) + r"\Z", re.IGNORECASE) for origin in settings.cors_origins]
    options = {
        "origins": origins,
        "methods": ["GET", "POST", "OPTIONS"],
        "allow_headers": ALLOWED_HEADERS,
        "expose_headers": EXPOSED_HEADERS,
        "supports_credentials": False,
        "max_age": settings.cors_max_age_seconds,
        "vary_header": True,
    }
    CORS(app, resources={path: options for path in BROWSER_PATHS})

    @app.after_request
    def vary_on_origin(response: Response) -> Response:
        # Every answer of a browser route depends on Origin (CORS headers for a listed one,
        # none otherwise), the answers to requests without one too: say so, or a shared
        # cache may hand the variant without CORS headers to a shop's page.
        if any(path.match(request.path) for path in BROWSER_PATHS):
            response.vary.add("Origin")
        return response
