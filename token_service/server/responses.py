"""JSON and RFC 9457 problem+json responses, and the handlers that make every error one.

No request, however malformed, may get a 500 with an HTML page: every error
leaves here as problem+json with a stable ``code``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from flask import Flask, Response
from werkzeug.exceptions import HTTPException

from token_service import problems
from token_service.errors import PayloadTooLarge, ServiceUnavailable, TokenError
from token_service.server import request_context
from token_service.server.metrics import REDIS_ERRORS
from token_service.server.telemetry import current_route

__all__ = [
    "JSON_ENCODER",
    "NO_STORE",
    "error_reply",
    "json_response",
    "json_text_response",
    "problem",
    "register_error_handlers",
]

log = logging.getLogger(__name__)

# Token values travel in these bodies: no cache may keep them.
NO_STORE = {"Cache-Control": "no-store"}


# One encoder for every reply: json.dumps with options builds a new one per call.
JSON_ENCODER = json.JSONEncoder(separators=(",", ":"))


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return json_text_response(JSON_ENCODER.encode(body), status, headers)


def json_text_response(payload: str, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A body already serialised as JSON (for replies built faster than json.dumps would)."""
    response = Response(payload, status=status, mimetype="application/json", headers=NO_STORE)
    if headers:
        response.headers.update(headers)
    return response


def problem(
    status: int, code: str, title: str, detail: str, headers: dict[str, str] | None = None, **extra: Any
) -> Response:
    status, document_headers, body = problems.problem(status, code, title, detail, **extra)
    return Response(body, status=status, headers={**document_headers, **(headers or {})})


def error_reply(error: BaseException, route: str) -> tuple[int, dict[str, str], bytes]:
    """The answer to what a request raised, on the Flask path and the hot path alike.

    A ``TokenError`` is its problem document, with the ``token_ref`` of the
    request's token when it named one (a 503 also counted against the route in
    ``token_service_redis_errors_total``); anything else is a bug:
    logged with its traceback and answered ``500 internal_error``.
    """
    if isinstance(error, ServiceUnavailable):
        REDIS_ERRORS.labels(route).inc()
    if isinstance(error, TokenError):
        # the token's digest, as the access line has it: what an operator looks the record up by
        return problems.problem_for(error, request_context.token_ref())
    log.error("unhandled error", exc_info=error)
    return problems.internal_error()


def _error(exc: Exception) -> Response:
    status, headers, body = error_reply(exc, current_route())
    return Response(body, status=status, headers=headers)


def _http_problem(exc: HTTPException) -> Response:
    status = exc.code or 500
    if status == 413:
        return _error(PayloadTooLarge("The request body is over the configured limit."))
    code = {404: "not_found", 405: "method_not_allowed"}.get(
        status, "invalid_request" if status < 500 else "internal_error"
    )
    headers = dict(exc.get_headers())
    headers.pop("Content-Type", None)
    return problem(status, code, exc.name, exc.description or exc.name, headers)


def register_error_handlers(app: Flask) -> None:
    app.register_error_handler(HTTPException, _http_problem)
    app.register_error_handler(Exception, _error)  # TokenError and bugs alike
