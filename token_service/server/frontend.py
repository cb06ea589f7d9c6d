"""The browser helper, ``GET /static/token-client.js``.

One source: ``frontend/token-client.js``, the npm package shops bundle. The
wheel carries it at the same path under ``token_service/`` and
:func:`token_service.resources.shipped` finds it in the installed package or
the checkout, as it finds ``lua/``. One explicit route rather than Flask's catch-all static folder, so the
app serves exactly the file it documents (and ``openapi.yaml`` can list it).
The URL is not versioned, so caches keep it briefly and then revalidate with
the ETag; browsers load it cross-origin as an ES module, so it is a frontend
route under the CORS allowlist.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

from flask import Blueprint, Response, request

from token_service.resources import shipped
from token_service.server.routes import TOKEN_CLIENT_JS

__all__ = ["CACHE_CONTROL", "HELPER", "asset", "asset_path", "asset_response", "make_blueprint"]

CACHE_CONTROL = "public, max-age=300, must-revalidate"
HELPER = "token-client.js"


def asset_path(name: str = HELPER) -> Path:
    """Where the file is: ``frontend/`` of the installed package or of the checkout."""
    return shipped("frontend") / name


@cache
def asset(name: str = HELPER) -> tuple[bytes, str]:
    """The file's bytes and a strong ETag over them."""
    data = asset_path(name).read_bytes()
    return data, hashlib.sha256(data).hexdigest()[:32]


def asset_response(name: str = HELPER) -> Response:
    """The file as a cacheable JavaScript response (304 on a matching If-None-Match)."""
    data, etag = asset(name)
    response = Response(data, mimetype="text/javascript")
    response.set_etag(etag)
    response.headers["Cache-Control"] = CACHE_CONTROL
    response.headers["X-Content-Type-Options"] = "nosniff"
    # 304 on a matching If-None-Match; HEAD drops the body.
    response.make_conditional(request)  # in place
    response.headers.remove("Date")  # the server adds its own
    return response


def make_blueprint() -> Blueprint:
    bp = Blueprint("frontend", __name__)

    @bp.get(TOKEN_CLIENT_JS.path)
    def token_client_js() -> Response:
        return asset_response()

    return bp
