"""Request bodies, read whole before anything parses them: a size limit on every framing, and a deadline.

A body is read in full, up to ``TOKEN_SERVICE_MAX_BODY_BYTES``, before a view
or the hot path looks at it:

- with a ``Content-Length`` over the limit: 413, and nothing is read;
- chunked (or otherwise without a length): one byte past the limit is read,
  and a body that has it is 413. Werkzeug's own limit stops quietly at the
  limit instead, and the cut-off body would be parsed as if it were whole;
- a body that ends before its ``Content-Length``, or whose client goes away
  mid-body: 400 ``invalid_request``, never parsed;
- a body that has not arrived ``TOKEN_SERVICE_BODY_TIMEOUT_SECONDS`` after the
  first read began: 408 ``request_timeout``. Under gevent workers (the
  default) that is a deadline for the whole body; under other worker classes
  it bounds each wait for the socket (a stalled client), where gunicorn's
  worker timeout is the backstop.

The hot path calls :func:`read_body` itself; every other request reads its
body through :class:`GuardedInput`, which ``wsgi.input`` becomes.
"""

from __future__ import annotations

import contextlib
import io
import socket
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from token_service.errors import InvalidRequest, PayloadTooLarge, RequestTimeout, TokenError

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

__all__ = [
    "BODY_STATE",
    "ENDED_EARLY",
    "FAILED",
    "READ",
    "TOO_LARGE",
    "GuardedInput",
    "guard",
    "has_body",
    "read_body",
]

TOO_LARGE = "The request body is over the configured limit."
ENDED_EARLY = "The request body ended early."
# What became of the body, in the environ: READ whole, or FAILED (refused, cut off, late).
# server/connections.py reads an unread body itself and closes the connection after a failed one.
BODY_STATE = "token_service.body"
READ = "read"
FAILED = "failed"


def has_body(environ: WSGIEnvironment) -> bool:
    return environ.get("CONTENT_LENGTH", "") not in ("", "0") or "HTTP_TRANSFER_ENCODING" in environ


def read_body(environ: WSGIEnvironment, max_bytes: int, timeout_seconds: float) -> bytes:
    """The whole body of the request, or PayloadTooLarge (413), InvalidRequest (400), RequestTimeout (408)."""
    try:
        raw = _read_body(environ, max_bytes, timeout_seconds)
    except TokenError:
        environ[BODY_STATE] = FAILED
        raise
    environ[BODY_STATE] = READ
    return raw


def _read_body(environ: WSGIEnvironment, max_bytes: int, timeout_seconds: float) -> bytes:
    stream = environ["wsgi.input"]
    text = environ.get("CONTENT_LENGTH", "")
    coding = environ.get("HTTP_TRANSFER_ENCODING")
    # gunicorn refuses codings it does not know, but passes "gzip, chunked" on de-chunked only:
    # such a body is not the JSON it would be parsed as
    if coding is not None and coding.strip().lower() != "chunked":
        raise InvalidRequest(
            "Only the chunked transfer coding is supported.", {"body": ["Unsupported transfer coding."]}
        )
    # gunicorn refuses a request with both (and any coding but chunked): the length is then absent
    length: int | None = None
    if text and coding is None:
        if not (text.isascii() and text.isdigit()):
            raise InvalidRequest("The Content-Length header is not a number.", {"body": ["Bad length."]})
        length = int(text)
        if length > max_bytes:
            raise PayloadTooLarge(TOO_LARGE)
    if length is None and not environ.get("wsgi.input_terminated"):
        return b""  # no length, and the server does not end the stream: no body (as Werkzeug reads it)
    wanted = max_bytes + 1 if length is None else length
    sock = environ.get("gunicorn.socket")
    try:
        raw = _read(stream, wanted, sock, timeout_seconds) if wanted else b""
        if len(raw) > max_bytes:
            raise PayloadTooLarge(TOO_LARGE)
        if length is not None and len(raw) != length:
            raise InvalidRequest(ENDED_EARLY, {"body": ["Incomplete body."]})
    except TokenError:
        # The body was not read to its end (a chunked body over the limit, a deadline, broken
        # framing): where the next request would start on this connection is unknown, so the
        # connection must not carry another one. (Over a Content-Length limit, above, nothing was
        # read: gunicorn skips the known length and the client gets its 413.)
        _no_more_requests(stream, sock)
        raise
    return raw


def _no_more_requests(stream: Any, sock: Any) -> None:
    if hasattr(stream, "failed"):
        stream.failed = True  # gunicorn >= 27 closes the connection after the reply
    elif sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RD)  # older gunicorn: its next read finds the end


def _read(stream: Any, wanted: int, sock: Any, timeout_seconds: float) -> bytes:
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("socket"):
        if _all_buffered(stream):
            return _read_until(stream, wanted)  # nothing to wait for: no timer to arm and cancel
        from gevent import Timeout

        # fires in this greenlet wherever it waits: a deadline for the whole body
        timer = Timeout(timeout_seconds)
        timer.start()
        try:
            return _read_until(stream, wanted)
        except Timeout as fired:
            if fired is not timer:
                raise  # someone else's deadline (a caller's), not the body's
            raise RequestTimeout(_timed_out(timeout_seconds)) from None
        finally:
            timer.close()
    if sock is None:
        return _read_until(stream, wanted)
    previous = sock.gettimeout()
    sock.settimeout(timeout_seconds)
    try:
        raw = _read_until(stream, wanted)
    except TimeoutError:
        # the socket keeps its timeout: gunicorn's next read of it (the rest of the body) ends soon too
        raise RequestTimeout(_timed_out(timeout_seconds)) from None
    sock.settimeout(previous)
    return raw


def _all_buffered(stream: Any) -> bool:
    """Whether gunicorn already holds all of a ``Content-Length`` body (the usual case: it came
    in with the head), so reading it cannot wait on the socket. False whenever unsure."""
    reader = getattr(stream, "reader", None)
    length = getattr(reader, "length", None)
    buffer = getattr(getattr(reader, "unreader", None), "buf", None)
    if type(length) is not int or not isinstance(buffer, io.BytesIO):
        return False  # chunked, another server, or another gunicorn: the timer decides
    return buffer.getbuffer().nbytes >= length


def _timed_out(timeout_seconds: float) -> str:
    return f"The request body did not arrive within {timeout_seconds:g} s."


def _read_until(stream: Any, wanted: int) -> bytes:
    """Up to ``wanted`` bytes: fewer only at the end of the body."""
    parts: list[bytes] = []
    got = 0
    try:
        while got < wanted:
            part = stream.read(wanted - got)
            if not part:
                break
            parts.append(part)
            got += len(part)
    except (TimeoutError, TokenError):  # a deadline: RequestTimeout, said by the caller
        raise
    except (OSError, ValueError):  # the client went away mid-body (gunicorn: NoMoreData, an IOError)
        raise InvalidRequest(ENDED_EARLY, {"body": ["Incomplete body."]}) from None
    except Exception as exc:  # the server's stream refused the framing (gunicorn: InvalidChunkSize, ...)
        raise InvalidRequest(
            f"The request body's framing is invalid ({type(exc).__name__}).", {"body": ["Bad framing."]}
        ) from None
    return parts[0] if len(parts) == 1 else b"".join(parts)


class GuardedInput(io.RawIOBase):
    """``wsgi.input`` for the Flask path: on the first read, the whole body through :func:`read_body`.

    Nothing is read until a view asks (so a view that checks the service key
    first still refuses an unauthenticated request before its body), and a
    view never sees part of a body: it gets all of it or the error.
    """

    def __init__(self, environ: WSGIEnvironment, max_bytes: int, timeout_seconds: float) -> None:
        super().__init__()
        self._request: dict[str, Any] = {
            key: environ[key]
            for key in (
                "wsgi.input",
                "wsgi.input_terminated",
                "CONTENT_LENGTH",
                "HTTP_TRANSFER_ENCODING",
                "gunicorn.socket",
            )
            if key in environ
        }
        self._environ = environ
        self._max_bytes = max_bytes
        self._timeout_seconds = timeout_seconds
        self._buffer: io.BytesIO | None = None

    def _body(self) -> io.BytesIO:
        if self._buffer is None:
            try:
                raw = read_body(self._request, self._max_bytes, self._timeout_seconds)
            finally:
                self._environ[BODY_STATE] = self._request.get(BODY_STATE, FAILED)
            self._buffer = io.BytesIO(raw)
        return self._buffer

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        return self._body().read(size)

    def readinto(self, buffer: Any) -> int:
        return self._body().readinto(buffer)

    def readline(self, size: int | None = -1) -> bytes:
        return self._body().readline(size)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body())


def guard(environ: WSGIEnvironment, max_bytes: int, timeout_seconds: float) -> None:
    """Make the request's ``wsgi.input`` a :class:`GuardedInput` (when it has a body)."""
    if has_body(environ):
        environ["wsgi.input"] = GuardedInput(environ, max_bytes, timeout_seconds)
