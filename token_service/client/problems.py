"""RFC 9457 problem documents for the SDK's web integrations, without Flask.

The same shape the service answers with (``token_service/responses.py``,
which needs Flask): ``type``, ``title``, ``status``, ``detail`` and the
stable ``code``, plus ``Retry-After`` where the error carries one.
"""

from __future__ import annotations

import json
from typing import Any

from token_service.errors import (
    InvalidRequest,
    RateLimited,
    ServiceUnavailable,
    TokenError,
    TokenFailed,
    TokenInProgress,
    TokenMismatch,
)

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


def problem_for(error: TokenError) -> tuple[int, dict[str, str], bytes]:
    extra: dict[str, Any] = {}
    if isinstance(error, InvalidRequest) and error.errors:
        extra["errors"] = error.errors
    elif isinstance(error, TokenMismatch) and error.field:
        extra["field"] = error.field
    elif isinstance(error, TokenFailed):
        extra["error"] = error.error
    retry_after = None
    if isinstance(error, TokenInProgress | RateLimited | ServiceUnavailable):
        retry_after = error.retry_after_seconds
        extra["retry_after_seconds"] = retry_after
    status, headers, body = problem(error.status, error.code, error.title, error.detail, **extra)
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    return status, headers, body
