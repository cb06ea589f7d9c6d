"""What the logs know about the request being answered: its id and the token it named.

A context variable rather than Flask's ``g``: the hot path
(:mod:`token_service.server.hot_path`) answers requests without Flask's contexts,
and the log filter runs in gunicorn's master too, where Flask is never
imported. Each thread (and each asyncio task) sees only its own request.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["RequestInfo", "current", "note_token_ref", "request_id", "token_ref"]


@dataclass(slots=True)
class RequestInfo:
    request_id: str
    # the digest of the request's token (TOKEN_REF_CHARS characters), never the token
    token_ref: str | None = None


current: ContextVar[RequestInfo | None] = ContextVar("token_service_request", default=None)


def request_id() -> str | None:
    info = current.get()
    return info.request_id if info is not None else None


def token_ref() -> str | None:
    """The digest of the token the request being answered named, if it named one."""
    info = current.get()
    return info.token_ref if info is not None else None


def note_token_ref(token_ref: str) -> None:
    """Remember which token the request named, for its access line (outside a request: nothing)."""
    info = current.get()
    if info is not None:
        info.token_ref = token_ref
