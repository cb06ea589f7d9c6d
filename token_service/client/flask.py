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
default a 5xx, 408, 409, 425, 429) or an exception releases
the token so the client may retry with it (exceptions listed in
``terminal`` record a terminal failure instead: duplicates get 409
``token_failed``). Token errors become problem+json: missing header 400,
unknown token 404, mismatch 403, in progress 409 with ``Retry-After``,
used 409, store down 503.

This is the only SDK module that imports Flask; ``token_service.client``
itself does not.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from flask import Request, Response, g, make_response, request
from werkzeug.exceptions import ClientDisconnected

from token_service.errors import InvalidRequest, TokenError
from token_service.problems import problem_for
from token_service.records import dump_json

from ._client import TokenClient
from ._fingerprint import body_fingerprint
from ._idempotency_core import Recorder
from ._response import (
    DEFAULT_MAX_RESULT_BYTES,
    DEFAULT_REPLAY_HEADERS,
    OMITTED_HEADER,
    REPLAYED_HEADER,
    StoredResponse,
    StorePolicy,
    default_store_status,
    refusal,
)
from .guard import Guard, Terminal

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MAX_RESULT_BYTES",
    "DEFAULT_REPLAY_HEADERS",
    "OMITTED_HEADER",
    "REPLAYED_HEADER",
    "current_guard",
    "default_store_status",
    "problem_response",
    "replay_response",
    "require_token",
    "stored_response",
]


def problem_response(error: TokenError) -> Response:
    status, headers, body = problem_for(error)
    return Response(body, status=status, headers=headers)


def _result(stored: StoredResponse, max_body_bytes: int, max_result_bytes: int) -> dict[str, Any]:
    """The token's result: with the body when it fits both limits, else with the body omitted."""
    # a body longer than max_result_bytes cannot fit once JSON-encoded: not encoded to find out
    if stored.omitted is None and len(stored.body) <= min(max_body_bytes, max_result_bytes):
        result = stored.to_result()
        # counted the way the store counts it (ASCII-only JSON: a CJK character takes 6 bytes)
        if len(dump_json(result)) <= max_result_bytes:
            return result
    omitted = stored.omitted if stored.omitted is not None else len(stored.body)
    return StoredResponse(stored.status, b"", stored.headers, omitted=omitted).to_result()


def _kept_headers(response: Response, replay_headers: Iterable[str]) -> list[tuple[str, str]]:
    wanted = {name.lower() for name in replay_headers}
    return [(name, value) for name, value in response.headers.items() if name.lower() in wanted]


def stored_response(
    response: Response,
    replay_headers: Iterable[str],
    max_body_bytes: int,
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
) -> dict[str, Any]:
    """The compact JSON form of a (buffered) response kept as the token's result.

    The body is kept only when it is at most ``max_body_bytes`` raw AND the whole
    stored form fits ``max_result_bytes`` once JSON-encoded the way the store counts
    it (ASCII-only: a CJK character takes 6 bytes). Otherwise the body is omitted.
    """
    stored = StoredResponse(
        response.status_code, response.get_data(), _kept_headers(response, replay_headers)
    )
    return _result(stored, max_body_bytes, max_result_bytes)


def replay_response(stored: Any) -> Response:
    """A duplicate's response from the token's stored result (``TypeError`` if it is not one)."""
    replayed = StoredResponse.from_result(stored)
    response = Response(replayed.body, status=replayed.status)
    response.headers.remove("Content-Type")
    for name, value in replayed.replay_headers():
        response.headers.add(name, value)
    return response


class _Recorded:
    """A streamed or direct-passthrough body on its way out: passed through, recorded, then settled."""

    def __init__(self, body: Iterable[Any], recorder: Recorder, settle: Callable[[Recorder, bool], None]):
        self.body = body
        self.recorder = recorder
        self.settle_with = settle
        self.settled = False

    def __iter__(self) -> Iterator[Any]:
        try:
            for chunk in self.body:
                # a streamed view may yield text: Werkzeug encodes it as UTF-8 after this
                if self.recorder.feed(chunk.encode() if isinstance(chunk, str) else chunk):
                    self._settle(failed=False)  # a Content-Length body is complete: record, then send
                yield chunk
        except GeneratorExit:
            raise  # closed early: close() records what went out
        except BaseException:
            self._settle(failed=True)
            raise
        self.recorder.complete = True
        self._settle(failed=False)

    def close(self) -> None:
        try:
            close = getattr(self.body, "close", None)
            if close is not None:
                close()
        finally:
            self._settle(failed=False)

    def _settle(self, *, failed: bool) -> None:
        if not self.settled:
            self.settled = True
            self.settle_with(self.recorder, failed)


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


def _request_fingerprint(spec: Callable[[Request], str | None] | Sequence[str] | None) -> str | None:
    if spec is None:
        return None
    if callable(spec):
        return spec(request)
    if isinstance(spec, str):
        raise TypeError("fingerprint fields must be a sequence of names, not one string")
    return body_fingerprint(request.get_data(), request.content_type, spec)


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
    wait_seconds: float = 0.0,
    max_body_bytes: int = 8192,
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    store_status: StorePolicy = default_store_status,
    on_replay: Callable[[Any], Any] | None = None,
    on_conflict: Callable[[Any, TokenError], Any] | None = None,
    on_mismatch: Callable[[Any, TokenError], Any] | None = None,
    on_lease_lost: Callable[[Any, TokenError], Any] | None = None,
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
    The hooks are the guard's (``on_replay(guard)``, ``on_conflict(guard, error)``, ...);
    the lease is renewed while the view runs and its response streams out.
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
            if _body_ended_early():
                return problem_response(
                    InvalidRequest(
                        "The request body ended before its Content-Length.", {"body": ["Incomplete."]}
                    )
                )
            guard = client.guard(
                token,
                scope,
                subject=subject(request) if subject else None,
                fingerprint=_request_fingerprint(fingerprint),
                lease_seconds=lease_seconds,
                terminal=terminal,
                wait_seconds=wait_seconds,
                on_replay=on_replay,
                on_conflict=on_conflict,
                on_mismatch=on_mismatch,
                on_lease_lost=on_lease_lost,
            )
            try:
                fresh = guard.start()
            except TokenError as exc:
                return problem_response(refusal(exc))
            if not fresh:
                return replay_response(guard.result)
            g.token_guard = guard
            try:
                response = make_response(view(*args, **kwargs))
            except BaseException as exc:
                guard.abandon_quietly(exc)
                raise
            if not store_status(response.status_code):
                # not an answer to keep (a 5xx, a 429...): free the token so the client can retry with it
                guard.abandon_quietly(None, retryable=True)
                return response
            kept = _kept_headers(response, replay_headers)
            if request.method == "HEAD" and (response.is_streamed or response.direct_passthrough):
                # no body goes out: what the view answered is its status and headers
                omitted = StoredResponse(
                    response.status_code, b"", kept, omitted=response.content_length or 0
                )
                _succeed(guard, scope, omitted.to_result())
                return response
            if response.is_streamed or response.direct_passthrough:
                # a file or a stream: never buffered whole, recorded as it goes out
                def settle(recorder: Recorder, failed: bool) -> None:
                    if failed:
                        guard.abandon_quietly(None, retryable=True)
                        return
                    stored = recorder.stored()
                    assert stored is not None
                    _succeed(guard, scope, _result(stored, max_body_bytes, max_result_bytes))

                # held up to what could be kept, never more (the rest is only counted)
                cap = min(max_body_bytes, max_result_bytes)
                recorder = Recorder(response.status_code, kept, cap, True, response.content_length)
                response.response = _Recorded(response.response, recorder, settle)
                return response
            stored = StoredResponse(response.status_code, response.get_data(), kept)
            _succeed(guard, scope, _result(stored, max_body_bytes, max_result_bytes))
            return response

        return guarded_view

    return decorate


def _succeed(guard: Guard, scope: str, result: dict[str, Any]) -> None:
    try:
        guard.succeed(result)
    except TokenError as exc:
        # The work is done and its response goes out; only the record of it is missing
        # (LeaseLost: the view outlived its lease, a duplicate may have run it again).
        log.error("could not store the response of a %s request: %s", scope, exc)
