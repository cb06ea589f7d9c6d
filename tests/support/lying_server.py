"""A hand-written "token service" on raw sockets: it answers what a test tells it to, however wrong.

The SDK's HTTP transport must read only what the contract allows and within the caller's
``timeout``; a real service never lies, stalls or floods, so these tests talk to this one.
Each connection is served on a thread of its own: the request is read whole (head and
``Content-Length`` body, kept in :attr:`LyingServer.requests`), then the connection gets
the test's answer and is closed.

Answers (functions of the connected socket):

- :func:`canned` — bytes sent at once (any status line, headers and body);
- :func:`trickle` — bytes sent one at a time, ``interval_seconds`` apart (a head or a body
  that never quite stops arriving: each read gets something, so per-read timeouts never fire);
- :func:`flood` — a ``200`` whose body goes on for ``total_bytes``.

An answer stops when the client hangs up; every answer is finite, so a client that waits
for it to end comes back (late) rather than hanging the test.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Answer", "LyingServer", "canned", "flood", "head", "json_reply", "trickle"]

Answer = Callable[[socket.socket], None]


def head(status: str, headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    """A response's bytes: ``status`` is the status line's rest (``"200 OK"``); a
    ``Content-Length`` is added for ``body`` unless the headers set framing themselves."""
    lines = [f"HTTP/1.1 {status}"] + [f"{name}: {value}" for name, value in (headers or {}).items()]
    framing = {name.lower() for name in headers or {}} & {"content-length", "transfer-encoding"}
    if not framing:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def json_reply(status: str, document: Any, media_type: str = "application/json") -> bytes:
    return head(status, {"Content-Type": media_type}, json.dumps(document).encode())


def canned(raw: bytes) -> Answer:
    def answer(conn: socket.socket) -> None:
        conn.sendall(raw)

    return answer


def trickle(raw: bytes, interval_seconds: float = 1.0, start: int = 0) -> Answer:
    """``raw[:start]`` at once, then the rest one byte every ``interval_seconds``."""

    def answer(conn: socket.socket) -> None:
        conn.sendall(raw[:start])
        for index in range(start, len(raw)):
            time.sleep(interval_seconds)
            conn.sendall(raw[index : index + 1])

    return answer


def flood(total_bytes: int, chunk_bytes: int = 1 << 20, chunked: bool = False) -> Answer:
    """A ``200 application/json`` whose body is ``total_bytes`` long (a JSON string's worth of
    ``x``), declared by ``Content-Length`` or sent ``chunked`` with no length at all."""
    opening = b'{"outcome":"consumed","replayed":false,"pad":"'
    closing = b'"}'
    filler = b"x" * chunk_bytes

    def answer(conn: socket.socket) -> None:
        framing = {"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": str(total_bytes)}
        conn.sendall(head("200 OK", {"Content-Type": "application/json", **framing}))
        left = total_bytes - len(opening) - len(closing)
        parts = [opening]
        while left > 0:
            parts.append(filler[: min(left, chunk_bytes)])
            left -= len(parts[-1])
        parts.append(closing)
        for part in parts:
            conn.sendall(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
        if chunked:
            conn.sendall(b"0\r\n\r\n")

    return answer


class LyingServer:
    """Listens on 127.0.0.1 (a free port) while in its ``with`` block; ``answer`` serves every
    connection. ``url`` is the base URL to give a client."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[dict[str, Any]] = []  # the JSON bodies received, in order
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)  # accept() wakes to see the server closing
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._threads: list[threading.Thread] = []
        self._closing = threading.Event()
        self._lock = threading.Lock()

    def __enter__(self) -> LyingServer:
        accepting = threading.Thread(target=self._accept, daemon=True)
        accepting.start()
        self._threads.append(accepting)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._closing.set()
        for thread in list(self._threads):
            thread.join(timeout=60)
        self._listener.close()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            with self._lock:
                self.connections += 1
            serving = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            serving.start()
            self._threads.append(serving)

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # the client hung up: the answer ends there
            conn.setblocking(True)
            conn.settimeout(30)
            body = _read_request(conn)
            with self._lock:
                self.requests.append(json.loads(body) if body else {})
            self.answer(conn)
            conn.shutdown(socket.SHUT_WR)
            # until the client closes: a close with unread bytes would reset the connection
            conn.settimeout(5)
            while conn.recv(65536):
                pass


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("closed before its request")
        data += chunk
    request_head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in request_head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("closed before its body")
        rest += chunk
    return rest[:length]
