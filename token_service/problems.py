"""RFC 9457 problem documents, without Flask: the one place their shape is decided.

The service (``responses.py`` wraps these in Flask responses) and the SDK's
web integrations (``client/flask.py``, ``client/wsgi.py``) answer with
the same document: ``type``, ``title``, ``status``, ``detail`` and the stable
``code``, plus ``Retry-After`` / ``WWW-Authenticate`` where the error calls for one.
"""

from __future__ import annotations

import json
from typing import Any

from token_service.errors import TokenError, Unauthorized

__all__ = ["CONTENT_TYPE", "PROBLEM_TYPE_BASE", "internal_error", "problem", "problem_for"]

PROBLEM_TYPE_BASE = "https://token-service.dev/problems/"
CONTENT_TYPE = "application/problem+json"


def problem(
    status: int, code: str, title: str, detail: str, **extra: Any
) -> tuple[int, dict[str, str], bytes]:
    """``(status, headers, body)`` of a problem+json response."""
    body = {
        "type": PROBLEM_TYPE_BASE + code,
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
    }
    body.update(extra)
    headers = {"Content-Type": CONTENT_TYPE, "Cache-Control": "no-store"}
    return status, headers, json.dumps(body, separators=(",", ":")).encode("utf-8")


def internal_error() -> tuple[int, dict[str, str], bytes]:
    """The answer to a bug: never the request's fault, and its message may not be safe to show."""
    return problem(500, "internal_error", "Internal error", "The service failed unexpectedly.")


def problem_for(error: TokenError, token_ref: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """The problem document of ``error``; ``token_ref``: the digest of the token the request named
    (the service's, as in its access line), so whoever holds the answer can have the record found."""
    extra = error.problem_extras()
    if token_ref is not None:
        extra["token_ref"] = token_ref
    status, headers, body = problem(error.status, error.code, error.title, error.detail, **extra)
    if "retry_after_seconds" in extra:
        headers["Retry-After"] = str(extra["retry_after_seconds"])
    if isinstance(error, Unauthorized):
        headers["WWW-Authenticate"] = 'Bearer realm="token-service"'
    return status, headers, body
