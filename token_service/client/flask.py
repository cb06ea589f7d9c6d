"""``@require_token``: guard a Flask view with an anti-duplicate-submit token.

::

    @app.post("/payments")
    @require_token(client, scope="payment.create")
    def create_payment():
        ...

The first request with a token runs the view; every duplicate gets its stored
response again (``Idempotent-Replayed: true``) without the view running. What is
kept, replayed or refused is docs/integrations/flask.md's; the decisions are
:mod:`._require_token_core`'s. This is the only SDK module that imports Flask.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Unpack

from token_service.errors import TokenError

from ._client import TokenClient
from ._extras import missing

try:
    from flask import Request, Response, current_app, g, make_response, request
    from werkzeug.exceptions import ClientDisconnected, HTTPException
except ModuleNotFoundError as exc:
    # no extra of ours: the decorator runs in the user's Flask app, which brings Flask
    missing(exc, __name__, ("flask", "werkzeug"), "pip install 'flask>=3.0'")
from ._require_token_core import Replay, Reply, RequireToken, RequireTokenArgs, answer_of, with_options
from ._stored_response import (
    default_store_status,
)
from .guard import Guard

__all__ = ["current_guard", "default_store_status", "problem_response", "require_token"]


def problem_response(error: TokenError) -> Response:
    """``error``'s problem+json answer, as the decorator sends it (a view may answer one too)."""
    return _answer(error)


def _answer(outcome: TokenError | Replay) -> Response:
    answer = answer_of(outcome)
    response = Response(answer.body, status=answer.status)
    response.headers.remove("Content-Type")  # the answer's own, if it has one
    for name, value in answer.headers:
        response.headers.add(name, value)
    return response


def current_guard() -> Guard | None:
    """The guard of the current request inside a ``@require_token`` view (its token, lease, ...)."""
    guard: Guard | None = g.get("token_guard")
    return guard


def _body_ended_early() -> bool:
    """A body shorter than its Content-Length: the client sent part of it, then closed (gunicorn
    then hands Werkzeug the short body without an error). Read (and cached for the view) before
    the token is touched."""
    declared = request.content_length
    if not declared:
        return False
    try:
        return len(request.get_data(cache=True)) < declared
    except (OSError, ClientDisconnected):
        return True


def _response_of(
    core: RequireToken, guard: Guard, view: Callable[..., Any], args: Any, kwargs: Any
) -> Response:
    """The view's response; for an ``HTTPException`` it raises, the one Flask's own dispatch answers
    it with (its error handler's; raised on, as any exception, under ``TRAP_HTTP_EXCEPTIONS``)."""
    try:
        return make_response(view(*args, **kwargs))
    except HTTPException as exc:
        if not core.answered(guard, exc):
            raise
        return make_response(current_app.handle_user_exception(exc))


@with_options
def require_token(
    client: TokenClient,
    scope: str,
    *,
    subject: Callable[[Request], str | None] | None = None,
    fingerprint: Callable[[Request], str | None] | Sequence[str] | None = None,
    max_body_bytes: int = 8192,
    **options: Unpack[RequireTokenArgs],
) -> Callable[[Callable[..., Any]], Callable[..., Response]]:
    """Decorate a Flask view so each token runs it at most once (docs/integrations/flask.md).

    ``subject`` and ``fingerprint`` (callables given the request, or body field names) must
    reproduce what the token was issued with; ``options``: every framework's (RequireTokenArgs)."""
    core = RequireToken.of(locals(), http_errors=(HTTPException,))  # first: before any other local

    def decorate(view: Callable[..., Any]) -> Callable[..., Response]:
        @functools.wraps(view)
        def guarded_view(*args: Any, **kwargs: Any) -> Response:
            token = core.token_of(request.headers.get(core.header))
            if isinstance(token, TokenError):
                return _answer(token)
            if _body_ended_early():
                return _answer(core.truncated())
            guard = core.begin(client, token, *core.identity(request, request.get_data, request.content_type))
            if isinstance(guard, TokenError | Replay):
                return _answer(guard)
            g.token_guard = guard
            try:
                response = _response_of(core, guard, view, args, kwargs)
            except BaseException as exc:
                guard.abandon_quietly(exc)  # a terminal exception is recorded, any other frees the token
                raise
            head = Reply(response.status_code, list(response.headers.items()))
            if not (response.is_streamed or response.direct_passthrough):
                not_recorded = core.settle(guard, Reply(head.status, head.headers, response.get_data()))
            elif (now := core.streamed(head, request.method, response.content_length)) is not None:
                not_recorded = core.settle(guard, now)  # Werkzeug never iterates a HEAD's body
            else:
                # a file or a stream: never buffered whole, recorded as it goes out
                response.response = core.record(guard, response.response, head, response.content_length)
                not_recorded = None
            if not_recorded is not None:
                return _answer(not_recorded)  # never a success whose outcome was not kept
            return response

        return guarded_view

    return decorate
