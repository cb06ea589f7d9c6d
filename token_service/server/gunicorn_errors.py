"""gunicorn's own error replies as problem+json, like every other error of the service.

gunicorn answers some requests before the application sees them: a request
line or header it cannot parse (400), a request line or header section over
its limits (414, 431), a transfer coding it does not support (501), bad chunk
framing (400), and an error its worker caught outside the application (500:
a worker killed by its timeout mid-request). It writes those with
``gunicorn.util.write_error``, an HTML page; ``post_fork`` in
``token_service.server.gunicorn_conf`` puts :func:`write_problem` in its place in each
worker, so these too are problem+json with a stable ``code`` and an
``X-Request-ID``.
"""

from __future__ import annotations

from typing import Any

from token_service import problems
from token_service.tokens import new_request_id

__all__ = ["install", "write_problem"]

# gunicorn's detail quotes what it could not parse: kept short
_MAX_DETAIL_CHARS = 200


def write_problem(sock: Any, status_int: int, reason: str, mesg: str) -> None:
    """``gunicorn.util.write_error``'s signature (every gunicorn release since 19), writing problem+json."""
    from gunicorn import util

    from token_service.server.connections import error_kind

    client_error = status_int < 500 or status_int == 501  # 501: a transfer coding gunicorn does not speak
    if client_error:
        # the kind of error only: gunicorn's message quotes the request's bytes (a token, maybe)
        detail = error_kind(mesg)[:_MAX_DETAIL_CHARS] or reason
        status, headers, body = problems.problem(status_int, "invalid_request", reason, detail)
    else:
        status, headers, body = problems.internal_error()
    head = [f"HTTP/1.1 {status} {reason}", "Connection: close"]
    head += [f"{name}: {value}" for name, value in headers.items()]
    head += [f"Content-Length: {len(body)}", f"X-Request-ID: {new_request_id()}"]
    util.write_nonblock(sock, ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)


def install() -> None:
    """Replace gunicorn's HTML error writer in this (worker) process."""
    from gunicorn import util

    util.write_error = write_problem
