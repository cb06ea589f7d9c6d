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
marked ``Idempotent-Body-Omitted: <original length>``). A 5xx response or an exception releases
the token so the client may retry with it (exceptions listed in
``terminal`` record a terminal failure instead: duplicates get 409
``token_failed``). Token errors become problem+json: missing header 400,
unknown token 404, mismatch 403, in progress 409 with ``Retry-After``,
used 409, store down 503.

This is the only SDK module that imports Flask; ``token_service.client``
itself does not.
"""

from __future__ import annotations

import base64
import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any

from flask import Request, Response, g, make_response, request

from token_service.errors import InvalidRequest, ServiceUnavailable, TokenError, Unauthorized
from token_service.problems import problem_for
from token_service.records import dump_json

from ._client import TokenClient
from .guard import Guard, Terminal

log = logging.getLogger(__name__)

REPLAYED_HEADER = "Idempotent-Replayed"
OMITTED_HEADER = "Idempotent-Body-Omitted"
# The service's default max_result_bytes (TOKEN_SERVICE_MAX_RESULT_BYTES): what a stored response may take.
DEFAULT_MAX_RESULT_BYTES = 16384
DEFAULT_REPLAY_HEADERS = ("Content-Type", "Location")


def problem_response(error: TokenError) -> Response:
    status, headers, body = problem_for(error)
    return Response(body, status=status, headers=headers)


def stored_response(
    response: Response,
    replay_headers: Iterable[str],
    max_body_bytes: int,
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
) -> dict[str, Any]:
    """The compact JSON form of a response kept as the token's result.

    The body is kept only when it is at most ``max_body_bytes`` raw AND the whole
    stored form fits ``max_result_bytes`` once JSON-encoded the way the store counts
    it (ASCII-only: a CJK character takes 6 bytes). Otherwise the body is omitted.
    """
    wanted = {name.lower() for name in replay_headers}
    stored: dict[str, Any] = {
        "s": response.status_code,
        "h": [[name, value] for name, value in response.headers.items() if name.lower() in wanted],
    }
    data = response.get_data()
    if len(data) <= max_body_bytes:
        with_body = dict(stored)
        try:
            with_body["b"] = data.decode("utf-8")
        except UnicodeDecodeError:
            with_body["b"] = base64.b64encode(data).decode("ascii")
            with_body["e"] = "base64"
        if len(dump_json(with_body)) <= max_result_bytes:
            return with_body
    # Too large to keep: duplicates get the status and headers, and know the body was dropped.
    stored["omitted"] = len(data)
    return stored


def replay_response(stored: Any) -> Response:
    if not isinstance(stored, dict) or not isinstance(stored.get("s"), int):
        # Not written by this decorator (another kind of guard used the token's scope).
        raise TypeError("the token's stored result is not a stored response")
    body = stored.get("b", "")
    data = base64.b64decode(body) if stored.get("e") == "base64" else body.encode("utf-8")
    response = Response(data, status=stored["s"])
    response.headers.remove("Content-Type")
    for name, value in stored.get("h", []):
        response.headers.add(name, value)
    if "omitted" in stored:
        # the same marker as the Idempotency-Key middleware: the body was too large to keep
        response.headers[OMITTED_HEADER] = str(stored["omitted"])
    response.headers[REPLAYED_HEADER] = "true"
    return response


def current_guard() -> Guard | None:
    """The guard of the current request inside a ``@require_token`` view (its token, lease, ...)."""
    guard: Guard | None = g.get("token_guard")
    return guard


def require_token(
    client: TokenClient,
    scope: str,
    *,
    header: str = "Idempotency-Token",
    subject: Callable[[Request], str | None] | None = None,
    fingerprint: Callable[[Request], str | None] | None = None,
    replay_headers: Iterable[str] = DEFAULT_REPLAY_HEADERS,
    lease_seconds: int | None = None,
    terminal: Terminal = (),
    wait_seconds: float = 0.0,
    max_body_bytes: int = 8192,
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
) -> Callable[[Callable[..., Any]], Callable[..., Response]]:
    """Decorate a Flask view so each token runs it at most once (see the module docs).

    ``subject`` and ``fingerprint`` are callables given the current request:
    they must reproduce what the token was issued with (e.g. the user id
    from the session, an order id from the body). A response body over
    ``max_body_bytes``, or whose stored form is over ``max_result_bytes`` of JSON
    (set it to the service's ``TOKEN_SERVICE_MAX_RESULT_BYTES``), is not kept:
    duplicates get the status and headers with ``Idempotent-Body-Omitted: <length>``.
    """
    replay_headers = tuple(replay_headers)

    def decorate(view: Callable[..., Any]) -> Callable[..., Response]:
        @functools.wraps(view)
        def guarded_view(*args: Any, **kwargs: Any) -> Response:
            token = request.headers.get(header, "").strip()
            if not token:
                return problem_response(
                    InvalidRequest(f"The {header} header is required.", {header: ["Missing."]})
                )
            guard = client.guard(
                token,
                scope,
                subject=subject(request) if subject else None,
                fingerprint=fingerprint(request) if fingerprint else None,
                lease_seconds=lease_seconds,
                terminal=terminal,
                wait_seconds=wait_seconds,
            )
            try:
                fresh = guard.start()
            except Unauthorized:
                # This backend's own key for the token service is wrong: not the end user's
                # fault and nothing they can fix. Fail closed (no work is done) and tell ops.
                log.error("the token service refused this backend's service key; check its configuration")
                return problem_response(
                    ServiceUnavailable("The token service is not available to this backend.")
                )
            except TokenError as exc:
                return problem_response(exc)
            if not fresh:
                return replay_response(guard.result)
            g.token_guard = guard
            try:
                response = make_response(view(*args, **kwargs))
            except BaseException as exc:
                guard.abandon_quietly(exc)
                raise
            if response.status_code >= 500:
                # not an answer to keep: free the token so the client can retry with it
                guard.abandon_quietly(None, retryable=True)
                return response
            try:
                guard.succeed(stored_response(response, replay_headers, max_body_bytes, max_result_bytes))
            except TokenError as exc:
                # The work is done and its response goes out; only the record of it is missing
                # (LeaseLost: the view outlived its lease, a duplicate may have run it again).
                log.error("could not store the response of a %s request: %s", scope, exc)
            return response

        return guarded_view

    return decorate
