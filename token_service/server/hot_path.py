"""A lean WSGI path for the two hottest routes: ``POST /token/generate`` and ``POST /token/consume``.

Flask's request and application contexts, URL routing, before/after hooks
and Response object cost a request about as much CPU as its own work
(docs/performance.md). This middleware sits in front of the Flask app and
answers those two routes itself, doing the same work through the same code:
the body parsed by ``api.parse_json_object``, checked by the same schemas,
the service key by ``auth.check_service_key``, the store called by
``api.HotOperations`` (which the Flask views call too), errors rendered by
``problems.problem_for``, and the request counted and logged by
``telemetry.record``. tests/test_hot_path.py sends the same requests down
both paths and compares status, headers and bodies.

It hands a request to Flask, untouched, whenever it is anything but the
plain case it is built for: another method, a body whose ``Content-Type``
is not exactly ``application/json`` (with or without a charset), a body
without a ``Content-Length`` or over the configured limit (Flask answers
413), or a request with an ``Origin`` when CORS is configured (flask-cors
decides its headers).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from werkzeug.http import HTTP_STATUS_CODES

from token_service import problems
from token_service.config import Settings
from token_service.errors import InvalidRequest, ServiceUnavailable, TokenError
from token_service.server import telemetry
from token_service.server.api import HotOperations, parse_json_object
from token_service.server.auth import check_service_key
from token_service.server.metrics import REDIS_ERRORS
from token_service.server.responses import JSON_ENCODER, NO_STORE

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

log = logging.getLogger(__name__)

GENERATE = "/token/generate"
CONSUME = "/token/consume"
_JSON_TYPES = frozenset(
    {"application/json", "application/json; charset=utf-8", "application/json;charset=utf-8"}
)
# Status lines as Werkzeug writes them ("201 CREATED"), built once.
_STATUS_LINES = {code: f"{code} {name.upper()}" for code, name in HTTP_STATUS_CODES.items()}
_JSON_HEADERS = [("Content-Type", "application/json"), *NO_STORE.items()]

# (status, headers, body) of a reply, before the request id is added
Reply = tuple[int, list[tuple[str, str]], bytes]


class HotPath:
    """WSGI middleware: answers plain generate and consume requests, hands the rest to ``app``."""

    def __init__(self, app: WSGIApplication, settings: Settings, operations: HotOperations) -> None:
        self.app = app
        self.operations = operations
        self.api_keys = settings.api_keys
        self.max_body_bytes = settings.max_body_bytes
        # flask-cors owns the CORS headers; a cross-origin browser request goes through it
        self.cors = bool(settings.cors_origins)
        header = settings.subject_header
        self.subject_key = "HTTP_" + header.upper().replace("-", "_") if header else None
        self.routes: dict[str, Callable[[WSGIEnvironment, int], Reply]] = {
            GENERATE: self._generate,
            CONSUME: self._consume,
        }

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        handler = self.routes.get(environ.get("PATH_INFO", ""))
        length = self._plain_length(environ) if handler is not None else 0
        if not length:
            return self.app(environ, start_response)
        assert handler is not None
        started = time.perf_counter()
        info = telemetry.open_request(environ.get("HTTP_X_REQUEST_ID"))
        route = environ["PATH_INFO"]
        try:
            try:
                status, headers, body = handler(environ, length)
            except ServiceUnavailable as error:
                REDIS_ERRORS.labels(route).inc()
                status, headers, body = _problem(error)
            except TokenError as error:
                status, headers, body = _problem(error)
            except Exception:
                log.exception("unhandled error")
                status, document_headers, body = problems.internal_error()
                headers = list(document_headers.items())
            headers.append(("Content-Length", str(len(body))))
            headers.append((telemetry.REQUEST_ID_HEADER, info.request_id))
            start_response(_STATUS_LINES[status], headers)
            telemetry.record(
                info, "POST", route, status, time.perf_counter() - started, environ.get("REMOTE_ADDR")
            )
        finally:
            telemetry.close_request()
        return [body]

    def _plain_length(self, environ: WSGIEnvironment) -> int:
        """The body's length if this is the plain request the hot path answers, else 0."""
        if (
            environ.get("REQUEST_METHOD") != "POST"
            or environ.get("CONTENT_TYPE", "").lower() not in _JSON_TYPES
            or "HTTP_TRANSFER_ENCODING" in environ
            or (self.cors and "HTTP_ORIGIN" in environ)
        ):
            return 0
        text = environ.get("CONTENT_LENGTH", "")
        if not (text.isascii() and text.isdigit()) or len(text) > 12:
            return 0
        length = int(text)
        return length if length <= self.max_body_bytes else 0

    def _generate(self, environ: WSGIEnvironment, length: int) -> Reply:
        body = parse_json_object(_read_body(environ, length))
        subject = environ.get(self.subject_key) if self.subject_key else None
        reply = self.operations.generate(body, subject, environ.get("REMOTE_ADDR"))
        return 201, _JSON_HEADERS.copy(), JSON_ENCODER.encode(reply).encode("utf-8")

    def _consume(self, environ: WSGIEnvironment, length: int) -> Reply:
        # the key first, as the Flask path checks it before its view reads the body
        check_service_key(self.api_keys, environ.get("HTTP_AUTHORIZATION"))
        reply = self.operations.consume(parse_json_object(_read_body(environ, length)))
        return 200, _JSON_HEADERS.copy(), JSON_ENCODER.encode(reply).encode("utf-8")


def _read_body(environ: WSGIEnvironment, length: int) -> bytes:
    """Exactly ``length`` bytes of body, or InvalidRequest (400) as Werkzeug answers a short body."""
    try:
        raw: bytes = environ["wsgi.input"].read(length)
    except (OSError, ValueError):  # the client went away mid-body (gunicorn: NoMoreData, an IOError)
        raw = b""
    if len(raw) != length:
        raise InvalidRequest("The request body ended early.", {"body": ["Incomplete body."]})
    return raw


def _problem(error: TokenError) -> Reply:
    status, headers, body = problems.problem_for(error)
    return status, list(headers.items()), body


def install(app: Any, settings: Settings, operations: HotOperations) -> None:
    """Put the hot path in front of a Flask app's WSGI callable (inside any ProxyFix)."""
    app.wsgi_app = HotPath(app.wsgi_app, settings, operations)
