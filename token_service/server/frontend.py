"""The browser helper, ``GET /static/token-client.js``, shipped inside the package.

One explicit route rather than Flask's catch-all static folder, so the app
serves exactly the file it documents (and ``openapi.yaml`` can list it). The
URL is not versioned, so caches keep it briefly and then revalidate with the
ETag; browsers load it cross-origin as an ES module, so it is a frontend
route under the CORS allowlist.
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources

from flask import Blueprint, Response, request

ASSET_ENDPOINTS = ("frontend.token_client_js",)
CACHE_CONTROL = "public, max-age=300, must-revalidate"


@cache
def asset(name: str) -> tuple[bytes, str]:
    """The file's bytes and a strong ETag over them."""
    data = resources.files("token_service.server").joinpath("static", name).read_bytes()
    return data, hashlib.sha256(data).hexdigest()[:32]


def make_blueprint() -> Blueprint:
    bp = Blueprint("frontend", __name__)

    @bp.get("/static/token-client.js")
    def token_client_js() -> Response:
        data, etag = asset("token-client.js")
        response = Response(data, mimetype="text/javascript")
        response.set_etag(etag)
        response.headers["Cache-Control"] = CACHE_CONTROL
        response.headers["X-Content-Type-Options"] = "nosniff"
        # 304 on a matching If-None-Match; HEAD drops the body.
        response.make_conditional(request)  # in place
        response.headers.remove("Date")  # the server adds its own
        return response

    return bp
