"""Client connections under gevent workers: a deadline for sending, no draining of a body nobody
read, and each request's budget for Redis.

Two gaps the request-side deadlines (``keepalive`` for the head,
``TOKEN_SERVICE_BODY_TIMEOUT_SECONDS`` for the body) leave open:

- **Slow readers.** A client that never reads its replies (a zero TCP
  window) would hold its greenlet and its slot of ``worker_connections``
  for as long as it likes: a gevent socket without a timeout waits forever
  in ``sendall``. Each client socket gets ``TOKEN_SERVICE_SEND_TIMEOUT_SECONDS``
  as its timeout (gevent's ``sendall`` treats it as a deadline for the whole
  reply), after which the connection is closed.
- **Replies before the body.** Some replies are decided before the body is
  read (401 without a service key, 404, 405, 415) or after reading failed
  (408, 413, bad framing). gunicorn would then read the rest of the body
  itself to reach the next request on the connection, and on bad framing
  log the raw bytes (a token among them) and write a second reply.
  :class:`FinishBody` reads an unread body itself, within the size limit
  and the deadline, and marks the connection to be closed when that fails
  or the body was refused; :func:`install` makes gunicorn close it (under
  granian, the reply says ``Connection: close``, which granian obeys).

Each request's Redis steps -- the wait for a pooled connection, a connect,
each send and read, redis-py's retries and their back-off -- keep to one
deadline, :func:`token_service.connection.request_budget_seconds` of the
settings, which :class:`FinishBody` (around every request) starts at the
request's first Redis step (:func:`token_service.deadline.from_first_use`):
so the service's worst case per request is that figure whatever Redis does,
and a client that sends its body slowly spends its own deadline, not Redis's.

And one cost: gunicorn writes a reply's head and its body with two
``sendall`` calls, two TCP segments. On loopback or a LAN each costs the
worker a system call and the kernel's whole send path, about a tenth of the
CPU of a token request (docs/performance.md). :class:`HeadWithBody` holds
the head back and sends it with the body.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from token_service import deadline
from token_service.errors import TokenError
from token_service.server import body

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = [
    "FinishBody",
    "HeadWithBody",
    "RedactGunicornErrors",
    "error_kind",
    "install",
    "redact_invalid_request",
]

log = logging.getLogger(__name__)

# Set by FinishBody during a request, read by the worker once the reply is written (same greenlet).
_close_after_reply: ContextVar[bool] = ContextVar("close_after_reply", default=False)


class FinishBody:
    """WSGI middleware: a body is read whole, or the connection is closed after the reply; the
    app's Redis steps share ``redis_budget_seconds`` (None: each has its own timeouts)."""

    def __init__(
        self,
        app: WSGIApplication,
        max_body_bytes: int,
        timeout_seconds: float,
        redis_budget_seconds: float | None = None,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.timeout_seconds = timeout_seconds
        self.redis_budget_seconds = redis_budget_seconds

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if self.redis_budget_seconds is None:
            reply = self.app(environ, start_response)
        else:
            # The service's replies are whole bodies, made before the app returns: none of the
            # request's Redis work runs while the iterable is being sent.
            with deadline.from_first_use(self.redis_budget_seconds):
                reply = self.app(environ, start_response)
        if body.has_body(environ):
            state = environ.get(body.BODY_STATE)
            if state is None:  # answered without reading it
                state = self._finish(environ)
            if state != body.READ:
                _close_after_reply.set(True)  # gunicorn: install() closes the connection
                _say_close(start_response)
        return reply

    def _finish(self, environ: WSGIEnvironment) -> str:
        try:
            stream = environ["wsgi.input"]
            if isinstance(stream, body.GuardedInput):
                stream.read()
            else:
                body.read_body(environ, self.max_body_bytes, self.timeout_seconds)
        except TokenError:
            return body.FAILED
        return body.READ


def _say_close(start_response: StartResponse) -> None:
    """Under granian: the reply says ``Connection: close``, which granian (hyper) obeys.

    granian's ``start_response`` is its response object, whose header list it reads only once the
    app has returned, so the header can still join it here; nothing is added anywhere else (on
    the failure path only: the replies that keep the connection cost nothing).
    """
    headers = getattr(start_response, "headers", None)
    if isinstance(headers, list):
        headers.append(("Connection", "close"))


def install(worker: Any, send_timeout_seconds: float) -> None:
    """In a gevent worker (``post_fork``): a send deadline on every client socket; close when asked."""
    handle_request = worker.handle_request

    def handle_request_with_deadline(listener_name: Any, req: Any, sock: Any, addr: Any) -> Any:
        # Set per request: gunicorn's handle() makes the socket blocking (no timeout) when it
        # accepts it. Longer than the head and body deadlines, which fire first while reading.
        sock.settimeout(send_timeout_seconds)
        token = _close_after_reply.set(False)
        joined = HeadWithBody(sock)
        try:
            try:
                result = handle_request(listener_name, req, joined, addr)
            finally:
                joined.flush()  # a reply without a body (HEAD, 204, 304): its head alone
            if _close_after_reply.get():
                # gunicorn's keep-alive loop ends on StopIteration and closes the socket
                raise StopIteration("the request body was not read whole")
            return result
        finally:
            _close_after_reply.reset(token)

    worker.handle_request = handle_request_with_deadline


_KEEP_ALIVE = b"\r\nConnection: keep-alive\r\n"
_CLOSE = b"\r\nConnection: close\r\n"


def _closing(head: bytes) -> bytes:
    """The head as sent: ``Connection: close`` when FinishBody decided to close after this reply.

    gunicorn wrote ``keep-alive`` (the request asked for nothing else) before
    the body turned out unread or refused; a client told the truth does not
    send its next request on a connection that is about to close.
    """
    if _close_after_reply.get():
        return head.replace(_KEEP_ALIVE, _CLOSE, 1)
    return head


class HeadWithBody:
    """A client socket, for one request, whose first ``sendall`` waits for the next one.

    gunicorn's Response sends the head (status line and headers) with one
    ``sendall`` and then each piece of the body with another; the head is
    held here and goes out in the same ``sendall`` as the first piece of the
    body -- or, if nothing follows, when the request is over (:meth:`flush`).
    Whatever else gunicorn does with the socket sees the bytes in the order
    it wrote them, sent in the socket's mode at the time of writing: any
    other way of sending, closing it or changing its timeout sends the held
    head first. Everything else is the socket's own.
    """

    __slots__ = ("_first", "_held", "_sock")

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._held: bytes | None = None
        self._first = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def sendall(self, data: bytes, flags: int = 0) -> None:
        if self._first and not flags:
            self._first = False
            self._held = bytes(data)
            return
        self._first = False
        held = self._held
        if held is not None:
            self._held = None
            data = _closing(held) + data
        self._sock.sendall(data, flags)

    def flush(self) -> None:
        """Send the held head, if any."""
        self._first = False
        held = self._held
        if held is not None:
            self._held = None
            self._sock.sendall(_closing(held))

    def send(self, data: bytes, flags: int = 0) -> int:
        self.flush()
        return int(self._sock.send(data, flags))

    def sendfile(self, file: Any, offset: int = 0, count: int | None = None) -> int:
        self.flush()
        return int(self._sock.sendfile(file, offset, count))

    def settimeout(self, value: float | None) -> None:
        self.flush()
        self._sock.settimeout(value)

    def setblocking(self, flag: bool) -> None:
        self.flush()
        self._sock.setblocking(flag)

    def shutdown(self, how: int) -> None:
        self.flush()
        self._sock.shutdown(how)

    def close(self) -> None:
        self.flush()
        self._sock.close()


class RedactGunicornErrors(logging.Filter):
    """gunicorn's error log without the request's own bytes, and slow readers in one line.

    gunicorn logs ``Invalid request from ip=...: <what it could not parse>``,
    quoting the raw header line or chunk -- which may hold a token. Only the
    kind of error is kept. A client that did not take its reply within the
    send deadline is logged as a warning without a traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Invalid request from "):
            record.msg = redact_invalid_request(message)
            record.args = ()
        elif message == "Socket error processing request." and record.exc_info:
            error = record.exc_info[1]
            if isinstance(error, TimeoutError):
                record.msg = "A client did not take its reply within the send deadline: connection closed."
                record.levelno, record.levelname = logging.WARNING, "WARNING"
                record.exc_info = None
                record.exc_text = None
        return True


def redact_invalid_request(message: str) -> str:
    """``Invalid request from ip=1.2.3.4: Invalid HTTP Header: 'X <tok>'`` → ``... Invalid HTTP Header``."""
    head, _, detail = message.partition(": ")
    return f"{head}: {error_kind(detail)}"


def error_kind(detail: str) -> str:
    """The words before the first quote or colon: the kind of error, none of the client's bytes."""
    cut = min(
        (i for i in (detail.find("'"), detail.find('"'), detail.find(":")) if i >= 0), default=len(detail)
    )
    return detail[:cut].strip() or "Invalid request"
