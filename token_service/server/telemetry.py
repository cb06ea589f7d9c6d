"""Per-request telemetry: a request id, one JSON access line, request metrics.

The request id is the caller's ``X-Request-ID`` when it is sane (1-128
characters of ``A-Za-z0-9._:-``, so it cannot forge log fields or smuggle a
header), else a new random one; either way it is returned in ``X-Request-ID``
and is in every log line written while the request runs. The access line
names the route, never the raw path of an unmatched URL, and never a token:
at most :data:`token_service.server.metrics.TOKEN_REF_CHARS` characters of its digest.
"""

from __future__ import annotations

import logging
import re
import time
from functools import cache
from typing import Any

from flask import Flask, Response, g, request

from token_service.server import request_context
from token_service.server.logs import DirectLines
from token_service.server.metrics import LATENCY, REQUESTS
from token_service.server.request_context import RequestInfo
from token_service.tokens import new_request_id

__all__ = [
    "MAX_CLIENT_CHARS",
    "REQUEST_ID_HEADER",
    "UNMATCHED",
    "close_request",
    "current_route",
    "install",
    "open_request",
    "record",
]

REQUEST_ID_HEADER = "X-Request-ID"
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}\Z")
UNMATCHED = "unmatched"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

access_log = logging.getLogger("token_service.access")
# the access line without a LogRecord where logging is the service's own (logs.DirectLines)
_direct_access = DirectLines(access_log)


def current_route() -> str:
    """The URL rule of the current Flask request (the ``route`` label), else ``unmatched``."""
    rule = request.url_rule
    return rule.rule if rule is not None else UNMATCHED


# Labelled children looked up once per (method, route, status), not on every request.
@cache
def _children(method: str, route: str, status: int) -> tuple[Any, Any]:
    return REQUESTS.labels(method, route, str(status)), LATENCY.labels(method, route)


# Where the access records say they come from (they are made here, not by Logger.info,
# which would walk the stack to find out for every request).
_ACCESS_SOURCE = (__file__, 0)


def open_request(offered_request_id: str | None) -> RequestInfo:
    """The request's id (the caller's if sane), made current for the logs until ``close_request``."""
    offered = offered_request_id or ""
    info = RequestInfo(offered if _SANE_REQUEST_ID.match(offered) else new_request_id())
    request_context.current.set(info)
    return info


def close_request() -> None:
    request_context.current.set(None)


MAX_CLIENT_CHARS = 64


def record(
    info: RequestInfo, method: str, route: str, status: int, duration_seconds: float, client: str | None
) -> None:
    """Count the request and write its access line (the Flask path and the hot path alike)."""
    # the method is the client's word: keep the label (and the caches) bounded
    method = method if method in _METHODS else "other"
    requests, latency = _children(method, route, status)
    requests.inc()
    latency.observe(duration_seconds)
    if access_log.isEnabledFor(logging.INFO):
        fields = {
            "request_id": info.request_id,
            "method": method,
            "route": route,
            "status": status,
            "duration_ms": round(duration_seconds * 1000, 3),
            # an address is at most 45 characters (IPv6 with IPv4 tail); with TRUSTED_PROXY_HOPS
            # set and no proxy in front, it is whatever X-Forwarded-For said (5,000 characters seen)
            "client": client
            if client is None or len(client) <= MAX_CLIENT_CHARS
            else client[:MAX_CLIENT_CHARS] + "…",
        }
        if info.token_ref:
            fields["token_ref"] = info.token_ref
        if _direct_access.write("request", fields):
            return
        access = access_log.makeRecord(
            access_log.name, logging.INFO, *_ACCESS_SOURCE, "request", (), None, extra=fields
        )
        access_log.handle(access)


def _start() -> None:
    context = g._get_current_object()
    context.started = time.perf_counter()
    context.request_info = open_request(request.headers.get(REQUEST_ID_HEADER))


def _finish(response: Response) -> Response:
    now = time.perf_counter()
    # one look-up each through Flask's context-local proxies, not one per attribute
    context = g._get_current_object()
    current = request._get_current_object()  # type: ignore[attr-defined]
    rule = current.url_rule
    # a request that failed before _start ran (or whose hooks were skipped) still gets an id
    info = context.get("request_info") or RequestInfo(new_request_id())
    response.headers[REQUEST_ID_HEADER] = info.request_id
    record(
        info,
        current.method,
        rule.rule if rule is not None else UNMATCHED,
        response.status_code,
        now - context.get("started", now),
        current.remote_addr,
    )
    return response


def _teardown(error: BaseException | None) -> None:
    close_request()


def install(app: Flask) -> None:
    app.before_request(_start)
    app.after_request(_finish)
    app.teardown_request(_teardown)
