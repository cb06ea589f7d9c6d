"""A lean WSGI path for the two hottest routes: ``POST /token/generate`` and ``POST /token/consume``.

Flask's request and application contexts, URL routing, before/after hooks
and Response object cost a request about as much CPU as its own work
(docs/performance.md). This middleware sits in front of the Flask app and
answers those two routes itself, doing the same work through the same code:
the body parsed by ``operations.parse_json_object``, checked by the same schemas,
the service key by ``auth.check_service_key`` where the route table says
one is needed, the store called by ``operations.HotOperations`` (which the Flask
views call too), errors answered by ``responses.error_reply``, and the
request counted and logged by ``telemetry.record``. tests/test_hot_path.py sends the same requests down
both paths and compares status, headers and bodies.

It hands a request to Flask whenever it is anything but the plain case it
is built for: another method, a body whose ``Content-Type`` is not exactly
``application/json`` (with or without a charset), or a request with an
``Origin`` when CORS is configured (flask-cors decides its headers). Either
way the body is read whole, within the size limit and the deadline, before
anything parses it (:mod:`token_service.server.body`): here by
``read_body``, on the Flask path through the ``wsgi.input`` it installs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from werkzeug.http import HTTP_STATUS_CODES

from token_service.config import Settings
from token_service.server import body, json_text, telemetry
from token_service.server.auth import check_service_key
from token_service.server.operations import HotOperations, parse_json_object
from token_service.server.responses import NO_STORE, error_reply
from token_service.server.routes import TOKEN_ROUTES, Route

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = ["HotPath", "Operation", "install"]

# Status lines as Werkzeug writes them ("201 CREATED"), built once.
_STATUS_LINES = {code: f"{code} {name.upper()}" for code, name in HTTP_STATUS_CODES.items()}
_JSON_TYPES = frozenset(
    {"application/json", "application/json; charset=utf-8", "application/json;charset=utf-8"}
)
_JSON_HEADERS = [("Content-Type", "application/json"), *NO_STORE.items()]

# An operation: the request's environ and its parsed body → the reply document.
Operation = Callable[["WSGIEnvironment", dict[str, Any]], dict[str, Any]]


class HotPath:
    """WSGI middleware: answers plain generate and consume requests, hands the rest to ``app``."""

    def __init__(self, app: WSGIApplication, settings: Settings, operations: HotOperations) -> None:
        self.app = app
        self.operations = operations
        self.api_keys = settings.api_keys
        self.max_body_bytes = settings.max_body_bytes
        self.body_timeout_seconds = settings.body_timeout_seconds
        # flask-cors owns the CORS headers; a cross-origin browser request goes through it
        self.cors = bool(settings.cors_origins)
        header = settings.subject_header
        self.subject_key = "HTTP_" + header.upper().replace("-", "_") if header else None
        operation_of: dict[str, Operation] = {"generate": self._generate, "consume": self._consume}
        self.routes: dict[str, tuple[Route, Operation]] = {
            route.path: (route, operation_of[route.endpoint]) for route in TOKEN_ROUTES if route.hot
        }

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        entry = self.routes.get(environ.get("PATH_INFO", ""))
        if entry is None or not self._plain(environ, entry[0]):
            body.guard(environ, self.max_body_bytes, self.body_timeout_seconds)
            return self.app(environ, start_response)
        route, operation = entry
        started = time.perf_counter()
        info = telemetry.open_request(environ.get("HTTP_X_REQUEST_ID"))
        try:
            try:
                # the key first, as the Flask path checks it before its view reads the body
                if route.needs_key:
                    check_service_key(self.api_keys, environ.get("HTTP_AUTHORIZATION"))
                raw = body.read_body(environ, self.max_body_bytes, self.body_timeout_seconds)
                reply = operation(environ, parse_json_object(raw))
                status, headers = route.status, _JSON_HEADERS.copy()
                document = json_text.compact(reply).encode("ascii")  # ensure_ascii: ASCII text
            except Exception as error:
                status, document_headers, document = error_reply(error, route.path)
                headers = list(document_headers.items())
            headers.append(("Content-Length", str(len(document))))
            headers.append((telemetry.REQUEST_ID_HEADER, info.request_id))
            if self.cors and route.browser:
                # what flask-cors would answer a request with an Origin differs: say so to caches
                headers.append(("Vary", "Origin"))
            start_response(_STATUS_LINES[status], headers)
            telemetry.record(
                info,
                route.method,
                route.path,
                status,
                time.perf_counter() - started,
                environ.get("REMOTE_ADDR"),
            )
        finally:
            telemetry.close_request()
        return [document]

    def _plain(self, environ: WSGIEnvironment, route: Route) -> bool:
        """Whether this is the plain request the hot path answers."""
        return (
            environ.get("REQUEST_METHOD") == route.method
            and environ.get("CONTENT_TYPE", "").lower() in _JSON_TYPES
            and not (self.cors and "HTTP_ORIGIN" in environ)
        )

    def _generate(self, environ: WSGIEnvironment, request: dict[str, Any]) -> dict[str, Any]:
        subject = environ.get(self.subject_key) if self.subject_key else None
        return self.operations.generate(request, subject, environ.get("REMOTE_ADDR"))

    def _consume(self, environ: WSGIEnvironment, request: dict[str, Any]) -> dict[str, Any]:
        return self.operations.consume(request)


def install(app: Any, settings: Settings, operations: HotOperations) -> None:
    """Put the hot path in front of a Flask app's WSGI callable (inside any ProxyFix)."""
    app.wsgi_app = HotPath(app.wsgi_app, settings, operations)
