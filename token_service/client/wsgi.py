"""``Idempotency-Key`` middleware for any WSGI app (IETF draft-ietf-httpapi-idempotency-key-header).

::

    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, redis.Redis.from_url(url))

For the unsafe methods (POST and PATCH by default) the client sends a key of
its choosing, ``Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"``.
The key is namespaced per client identity (``identity(environ)``, by default
the ``Authorization`` header, else ``REMOTE_USER``), and the request is
fingerprinted (method, path, query string, and the body by what it means: a
JSON body by its parsed value, so key order and whitespace do not matter;
``fingerprint=`` takes chosen field names or a callable). A request with a key but no
identity (``identity`` returns ``""`` or ``None``) gets 400
``idempotency_identity_required`` and does not run: anonymous clients would all
share one namespace and could be handed each other's responses. Pass your own
``identity`` to key on a stable principal (the user id behind an OAuth token:
the raw header changes when the token is refreshed), or return a constant on
purpose to share keys between anonymous clients. Then:

- the first request with a key runs, and its response (status, headers,
  body) is stored for ``ttl_seconds`` when ``store_status(status)`` says so
  (by default 2xx, 3xx and 4xx except 401, 407, 408, 409, 425 and 429; never
  5xx; never 401, 403 or 407 whatever ``store_status`` says: a refusal of the
  credentials the key was claimed under is no result);
  the body streams through to the client and is kept up to
  ``max_stored_bytes``, a 4xx's up to ``max_stored_4xx_bytes`` (a larger one is
  stored as omitted: duplicates get the status and headers with
  ``Idempotent-Body-Omitted: <length>``);
- a repeat gets the stored response, with ``Idempotent-Replayed: true``,
  without the app running;
- a repeat while the first is still running gets 409 (``Retry-After`` set),
  or with ``wait_seconds`` waits that long for the first one's response;
- the same key with a different request gets 422;
- no key gets 400 when ``required`` (else the request just runs);
- a response that is not stored (a 5xx, a 429, ...) or an exception frees
  the key for a retry.

Redis failures answer 503 (fail closed: the request does not run unguarded),
and so does a record the store refuses (e.g. the key holds something else).

While the app runs, the claim is renewed every third of ``lock_seconds``, so a
request slower than its lock keeps its key; a process that dies stops
renewing, and the key is free again ``lock_seconds`` later.
A first request costs Redis two commands and a replay one, on the record every
guard shares (:mod:`token_service.client._idempotency_store`);
the decisions are :mod:`token_service.client._idempotency_core`'s, shared with
the ASGI middleware. No Flask needed.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Unpack

from token_service import defaults
from token_service.client._fingerprint import RequestFacts
from token_service.client._idempotency_core import (
    Answer,
    Attempt,
    IdempotencyCore,
    Recorder,
    declared_length,
    status_line,
)
from token_service.client._idempotency_options import IdempotencyOptionArgs, IdempotencyOptions
from token_service.client._idempotency_store import IdempotencyStore
from token_service.client._stored_response import default_store_status

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = ["IdempotencyMiddleware", "IdempotencyOptions", "default_store_status"]


def default_identity(environ: WSGIEnvironment) -> str:
    """Who the client is: its credentials (hashed into the record key, never stored); "" if unknown."""
    return str(environ.get("HTTP_AUTHORIZATION") or environ.get("REMOTE_USER") or "")


def _facts(environ: WSGIEnvironment, body: bytes) -> RequestFacts:
    headers = {
        name[5:].replace("_", "-").lower(): str(value)
        for name, value in environ.items()
        if name.startswith("HTTP_")
    }
    if environ.get("CONTENT_TYPE"):
        headers["content-type"] = environ["CONTENT_TYPE"]
    return RequestFacts(
        method=environ.get("REQUEST_METHOD", "GET").upper(),
        path=environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", ""),
        query=environ.get("QUERY_STRING", ""),
        body=body,
        content_type=environ.get("CONTENT_TYPE"),
        headers=headers,
    )


def _send(start_response: StartResponse, answer: Answer) -> Iterable[bytes]:
    start_response(status_line(answer.status), answer.headers)
    return [answer.body]


class IdempotencyMiddleware:
    """Wrap a WSGI app so that each ``Idempotency-Key`` runs at most one request (see module docs)."""

    def __init__(
        self,
        app: WSGIApplication,
        store: IdempotencyStore | Any,
        *,
        options: IdempotencyOptions | None = None,
        applies: Callable[[WSGIEnvironment], bool] | None = None,
        identity: Callable[[WSGIEnvironment], str | None] = default_identity,
        key_prefix: str = defaults.KEY_PREFIX,
        **overrides: Unpack[IdempotencyOptionArgs],
    ) -> None:
        # the options by name (ttl_seconds=60, ...) on top of options=: one value for the core
        self.core = IdempotencyCore(options, **overrides)
        self.app = app
        self.store = (
            store if isinstance(store, IdempotencyStore) else IdempotencyStore(store, key_prefix=key_prefix)
        )
        self.environ_key = "HTTP_" + self.core.options.header.upper().replace("-", "_")
        self.applies = applies
        self.identity = identity

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        core = self.core
        if self.applies is not None and not self.applies(environ):
            return self.app(environ, start_response)
        screened = core.screen(environ.get("REQUEST_METHOD", "GET"), environ.get(self.environ_key))
        if screened is None:
            return self.app(environ, start_response)
        if isinstance(screened, Answer):
            return _send(start_response, screened)
        try:
            body = self._read_body(environ)
        except _BodyEndedEarly:
            # less than the declared Content-Length came: neither claim the key nor run the app on it
            return _send(start_response, core.truncated())
        if body is None:
            return _send(start_response, core.too_large())
        attempt = core.attempt(self.store, self.identity(environ), screened, _facts(environ, body))
        if isinstance(attempt, Answer):
            return _send(start_response, attempt)
        answer = core.claim(self.store, attempt)
        if answer is not None:
            return _send(start_response, answer)
        return _Relay(self, attempt).run(environ, start_response)

    def _read_body(self, environ: WSGIEnvironment) -> bytes | None:
        """The whole body (None when over the limit); the app gets a fresh stream of it.

        :class:`_BodyEndedEarly` when the stream ends before CONTENT_LENGTH."""
        limit = self.core.options.max_body_bytes
        stream = environ.get("wsgi.input")
        length = declared_length(environ.get("CONTENT_LENGTH") or "") or 0
        if length > limit:
            return None
        if stream is None:
            body = b""
        elif length:
            body = _read_exactly(stream, length)
        elif environ.get("wsgi.input_terminated"):
            try:
                body = stream.read(limit + 1)
            except OSError as exc:  # a chunked body cut off before its last chunk
                raise _BodyEndedEarly from exc
            if len(body) > limit:
                return None
        else:
            body = b""
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        return body


class _BodyEndedEarly(Exception):
    """The request body ended before its Content-Length (the client sent less, then closed)."""


def _read_exactly(stream: Any, length: int) -> bytes:
    """``length`` bytes of ``stream``; :class:`_BodyEndedEarly` when it ends (or breaks) before them."""
    chunks: list[bytes] = []
    left = length
    try:
        while left > 0:
            # a read may return less than asked; only an empty one is the end
            chunk = stream.read(left)
            if not chunk:
                raise _BodyEndedEarly
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:  # the client went away mid-body (gunicorn's NoMoreData is an IOError)
        raise _BodyEndedEarly from exc
    return b"".join(chunks)


class _Relay:
    """The app's response on its way out: passed through chunk by chunk, recorded, then settled.

    The key is held from :meth:`run` until the body is exhausted or the server
    closes the response (whichever comes first), inside ``core.hold``.
    """

    def __init__(self, middleware: IdempotencyMiddleware, attempt: Attempt) -> None:
        self.core = middleware.core
        self.store = middleware.store
        self.app = middleware.app
        self.attempt = attempt
        self.recorder: Recorder | None = None
        self.result: Iterable[bytes] = ()
        self.settled = False
        self.hold = self.core.hold(self.store, attempt)

    def run(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        def relay_start(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Callable[[bytes], Any]:
            self.recorder = self.core.recorder(int(status.split(" ", 1)[0]), headers)
            write = start_response(status, headers, exc_info)

            def relay_write(chunk: bytes) -> Any:
                if self.recorder is not None:
                    self.recorder.feed(chunk)
                return write(chunk)

            return relay_write

        self.hold.__enter__()
        try:
            self.result = self.app(environ, relay_start)
        except BaseException as exc:
            self._settle(exc)
            raise
        return self

    def __iter__(self) -> Iterator[bytes]:
        try:
            for chunk in self.result:
                if self.recorder is not None and self.recorder.feed(chunk):
                    self._settle(None)  # the last byte of a Content-Length body: settle, then send
                yield chunk
        except GeneratorExit:
            raise  # closed early (the client left): close() settles it
        except BaseException as exc:
            self._settle(exc)
            raise
        if self.recorder is not None:
            # a chunked or close-delimited body ends after this: settle before its end goes out
            self.recorder.complete = True
        self._settle(None)

    def close(self) -> None:
        try:
            close = getattr(self.result, "close", None)
            if close is not None:
                close()
        finally:
            self._settle(None, breaking=False)  # closed early: nothing more goes out to break off

    def _settle(self, error: BaseException | None, *, breaking: bool = True) -> None:
        """Store or free the key while it is still held (renewed), then stop holding it. A response
        that could not be kept is broken off: its error is raised before its end goes out."""
        if self.settled:
            return
        self.settled = True
        recorder = self.recorder
        if recorder is not None and error is not None:
            recorder.failed = True
        not_recorded = None
        try:
            not_recorded = self.core.settle(self.store, self.attempt, recorder)
        finally:
            self.hold.__exit__(type(error) if error else None, error, error.__traceback__ if error else None)
        if not_recorded is not None and breaking and error is None:
            raise not_recorded
