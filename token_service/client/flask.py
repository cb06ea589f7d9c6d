"""``@require_token``: guard a Flask view with an anti-duplicate-submit token.

::

    @app.post("/payments")
    @require_token(client, scope="payment.create")
    def create_payment():
        ...

The token comes from the ``Idempotency-Token`` header (configurable). The
first request with it runs the view; its response (status, body and the
headers named in ``replay_headers``) is stored as the token's result, and
every duplicate gets that response again, marked ``Idempotent-Replayed:
true``, without the view running (a body too large to keep is replayed empty,
marked ``Idempotent-Body-Omitted: <original length>``). Every kind of response
works: ``send_file()`` and other direct-passthrough or streamed bodies pass
through to the client and are recorded as they go (kept up to
``max_body_bytes``, else recorded as omitted); the outcome is recorded when
the last byte is handed to the server, or when the server closes the
response early. A response whose status ``store_status`` does not keep (by
default a 5xx, 401, 407, 408, 409, 425, 429) or an exception releases
the token so the client may retry with it; an ``HTTPException`` the view
raises (``abort(404)``) is the response Flask answers it with, kept or not by
the same rule (exceptions listed in
``terminal`` record a terminal failure instead: duplicates get 409
``token_failed``). Token errors become problem+json: missing header 400,
unknown token 404, mismatch 403, in progress 409 with ``Retry-After``,
used 409, store down 503; a response whose outcome could not be stored for as
long as the lease could be held is never sent as a success: 500
``outcome_not_recorded`` (a streamed one is broken off).

This is the only SDK module that imports Flask; ``token_service.client``
itself does not.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
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
from ._require_token_core import DEFAULT_WAIT_SECONDS, Replay, Reply, RequireToken, answer_of
from ._stored_response import (
    DEFAULT_MAX_RESULT_BYTES,
    DEFAULT_REPLAY_HEADERS,
    StorePolicy,
    default_store_status,
)
from .guard import Guard, GuardHookArgs, GuardHooks, Terminal

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
    """A body shorter than its Content-Length: the client sent part of it, then closed.

    gunicorn ends ``wsgi.input`` at the client's end of stream, so Werkzeug then
    returns the short body without an error: the view would run on part of the
    request and use the token up. Read here (and cached for the view) before the token is touched.
    """
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
    """The view's response; for an ``HTTPException`` it raises (``abort(404)``), the one Flask
    answers it with, as Flask's own dispatch does: its error handler's, else the exception's page
    (not when the app traps it, ``TRAP_HTTP_EXCEPTIONS``: then it is raised, as any exception)."""
    try:
        return make_response(view(*args, **kwargs))
    except HTTPException as exc:
        if not core.answered(guard, exc):
            raise
        return make_response(current_app.handle_user_exception(exc))


def require_token(
    client: TokenClient,
    scope: str,
    *,
    header: str = "Idempotency-Token",
    subject: Callable[[Request], str | None] | None = None,
    fingerprint: Callable[[Request], str | None] | Sequence[str] | None = None,
    replay_headers: Iterable[str] = DEFAULT_REPLAY_HEADERS,
    lease_seconds: int | None = None,
    terminal: Terminal = (),
    wait_seconds: float = DEFAULT_WAIT_SECONDS,
    max_body_bytes: int = 8192,
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    store_status: StorePolicy = default_store_status,
    hooks: GuardHooks | None = None,
    **hook_args: Unpack[GuardHookArgs],
) -> Callable[[Callable[..., Any]], Callable[..., Response]]:
    """Decorate a Flask view so each token runs it at most once (see the module docs).

    ``subject`` and ``fingerprint`` are callables given the current request:
    they must reproduce what the token was issued with (e.g. the user id
    from the session, an order id from the body). ``fingerprint`` may also be
    a list of body field names: the token is then issued with
    ``fields_fingerprint({name: value, ...})`` (JSON or form bodies; key order
    and whitespace do not matter). A response body over
    ``max_body_bytes``, or whose stored form is over ``max_result_bytes`` of JSON
    (set it to the service's ``TOKEN_SERVICE_MAX_RESULT_BYTES``), is not kept:
    duplicates get the status and headers with ``Idempotent-Body-Omitted: <length>``.
    ``store_status(status)`` says which responses are kept (the others free the token).
    The hooks are the guard's: ``hooks=GuardHooks(...)``, or by name (``on_replay(guard)``,
    ``on_conflict(guard, error)``, ...), made one value once;
    the lease is renewed while the view runs and its response streams out.
    """
    core = RequireToken.of(locals(), http_errors=(HTTPException,))  # first: before any other local

    def decorate(view: Callable[..., Any]) -> Callable[..., Response]:
        @functools.wraps(view)
        def guarded_view(*args: Any, **kwargs: Any) -> Response:
            token = core.token_of(request.headers.get(header))
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
                core.failed(guard, exc)
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
