"""``Idempotency-Key`` middleware for any WSGI app (IETF draft-ietf-httpapi-idempotency-key-header).

::

    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, redis.Redis.from_url(url))

A request with a key runs once per client (``identity(environ)``, by default the ``Authorization``
header, else ``REMOTE_USER``); a repeat gets its stored response with ``Idempotent-Replayed: true``,
one still running 409, the same key with another request 422, no key 400 (when ``required``), a
Redis that fails 503 (fail closed); a response not stored (5xx, 429, ...) or an exception frees the
key. What each request gets, which responses are stored and the options:
docs/integrations/wsgi-middleware.md. The decisions are :mod:`._idempotency_core`'s, shared with
the ASGI and Django middlewares, on the record every guard shares. No Flask needed.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from token_service.client._engine import drive
from token_service.client._fingerprint import RequestFacts
from token_service.client._idempotency_core import Answer, BodyEndedEarly, Middleware, Relay, declared_length
from token_service.client._idempotency_options import IdempotencyOptions
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
    try:
        status = f"{answer.status} {HTTPStatus(answer.status).phrase}"
    except ValueError:
        status = f"{answer.status} Unknown"
    start_response(status, answer.headers)
    return [answer.body]


class IdempotencyMiddleware(Middleware["WSGIApplication", "WSGIEnvironment", IdempotencyStore]):
    """Wrap a WSGI app so that each ``Idempotency-Key`` runs at most one request (see module docs)."""

    app: WSGIApplication
    store_class = IdempotencyStore
    default_identity = staticmethod(default_identity)

    @functools.cached_property
    def _environ_key(self) -> str:
        return "HTTP_" + self.core.options.header.upper().replace("-", "_")

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if self.applies is not None and not self.applies(environ):
            return self.app(environ, start_response)
        screened = self.core.screen(environ.get("REQUEST_METHOD", "GET"), environ.get(self._environ_key))
        if screened is None:
            return self.app(environ, start_response)
        if isinstance(screened, Answer):
            return _send(start_response, screened)
        read_body = functools.partial(self._read_body, environ)
        admitted = drive(self.admitting(environ, screened, read_body, functools.partial(_facts, environ)))
        if isinstance(admitted, Answer):
            return _send(start_response, admitted)
        return _Relay(self, admitted).run(environ, start_response)

    def _read_body(self, environ: WSGIEnvironment) -> bytes | None:
        """The whole body (None when over the limit); the app gets a fresh stream of it."""
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
                raise BodyEndedEarly from exc
            if len(body) > limit:
                return None
        else:
            body = b""
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        return body


def _read_exactly(stream: Any, length: int) -> bytes:
    """``length`` bytes of ``stream``; :class:`BodyEndedEarly` when it ends (or breaks) before them."""
    chunks: list[bytes] = []
    left = length
    try:
        while left > 0:
            # a read may return less than asked; only an empty one is the end
            chunk = stream.read(left)
            if not chunk:
                raise BodyEndedEarly
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:  # the client went away mid-body (gunicorn's NoMoreData is an IOError)
        raise BodyEndedEarly from exc
    return b"".join(chunks)


class _Relay(Relay[IdempotencyStore]):
    """The key is held (``core.hold``) from :meth:`run` until the body is exhausted or the server
    closes the response, whichever comes first; chunk by chunk."""

    result: Iterable[bytes] = ()

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

        self.hold = self.core.hold(self.store, self.attempt)
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
        if not self._settles(failed=error is not None):
            return
        not_recorded = None
        try:
            not_recorded = self.core.settle(self.store, self.attempt, self.recorder)
        finally:
            self.hold.__exit__(type(error) if error else None, error, error.__traceback__ if error else None)
        if not_recorded is not None and breaking and error is None:
            raise not_recorded
