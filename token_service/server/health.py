"""Operational routes: what answers at ``/``, liveness, readiness and the OpenAPI document."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import cache
from pathlib import Path

from flask import Blueprint, Response

from token_service import __version__
from token_service.resources import shipped
from token_service.server.responses import json_response
from token_service.store import TokenStore

__all__ = ["make_blueprint", "openapi_path"]


def openapi_path() -> Path:
    """The HTTP contract (``openapi.yaml``, in the installed package or the checkout)."""
    return shipped("openapi.yaml")


@cache
def _openapi_text() -> str:
    return openapi_path().read_text(encoding="utf-8")


def make_blueprint(
    store: TokenStore, drain_file: str = "", warnings: Callable[[], list[str]] = list
) -> Blueprint:
    bp = Blueprint("ops", __name__)

    @bp.get("/")
    def index() -> Response:
        # A newcomer's first request (a browser on the port, curl without a path): what this
        # is and where to read on, instead of a 404.
        return json_response(
            {
                "service": "token-service",
                "version": __version__,
                "docs": "README.md and docs/ of the source; make docs serves them on http://127.0.0.1:8001",
                "links": {
                    "openapi": "/openapi.yaml",
                    "healthz": "/healthz",
                    "readyz": "/readyz",
                    "client_js": "/static/token-client.js",
                },
            }
        )

    @bp.get("/healthz")
    def healthz() -> Response:
        # Alive means the process answers; Redis is readiness's business.
        return json_response({"status": "ok"})

    @bp.get("/readyz")
    def readyz() -> Response:
        # Draining for shutdown (or taken out by an operator): alive, but send nothing new here.
        if drain_file and os.path.exists(drain_file):
            return json_response({"status": "draining"}, 503, {"Retry-After": "5"})
        store.ready()  # ServiceUnavailable → 503 store_unavailable (unreachable, or refusing writes)
        noticed = warnings()
        # ready, but configured for another deployment than this one (e.g. a proxy it ignores)
        return json_response({"status": "ready", "warnings": noticed} if noticed else {"status": "ready"})

    @bp.get("/openapi.yaml")
    def openapi() -> Response:
        return Response(_openapi_text(), mimetype="application/yaml")

    return bp
