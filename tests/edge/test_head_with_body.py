"""A reply's head goes out with its body in one send (connections.HeadWithBody); nothing lost or reordered.

Unit tests on a recording socket, then ``token-service serve`` (gevent, as
shipped) answering replies with a body, without one (HEAD) and an early one,
on one keep-alive connection.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import RedisServer, serve_one_worker
from tests.support.raw_http import connect, read_reply, request_bytes
from tests.support.service import API_KEY
from token_service.server.connections import HeadWithBody


class Recorder:
    """A socket that records what is done to it."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def sendall(self, data: bytes, flags: int = 0) -> None:
        self.calls.append(("sendall", data, flags))

    def send(self, data: bytes, flags: int = 0) -> int:
        self.calls.append(("send", data, flags))
        return len(data)

    def sendfile(self, file: Any, offset: int = 0, count: int | None = None) -> int:
        self.calls.append(("sendfile", file, offset, count))
        return count or 0

    def settimeout(self, value: float | None) -> None:
        self.calls.append(("settimeout", value))

    def setblocking(self, flag: bool) -> None:
        self.calls.append(("setblocking", flag))

    def shutdown(self, how: int) -> None:
        self.calls.append(("shutdown", how))

    def close(self) -> None:
        self.calls.append(("close",))

    def gettimeout(self) -> float:
        return 2.5


def test_the_head_goes_out_with_the_first_piece_of_the_body() -> None:
    sock = Recorder()
    joined = HeadWithBody(sock)
    joined.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
    assert sock.calls == []
    joined.sendall(b"body")
    joined.sendall(b"more")
    joined.flush()
    assert sock.calls == [("sendall", b"HTTP/1.1 200 OK\r\n\r\nbody", 0), ("sendall", b"more", 0)]


def test_a_head_without_a_body_goes_out_on_flush_once() -> None:
    sock = Recorder()
    joined = HeadWithBody(sock)
    joined.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
    joined.flush()
    joined.flush()
    assert sock.calls == [("sendall", b"HTTP/1.1 204 No Content\r\n\r\n", 0)]


@pytest.mark.parametrize(
    ("operation", "expected"),
    [
        (lambda s: s.send(b"x"), ("send", b"x", 0)),
        (lambda s: s.sendfile("file", offset=3, count=5), ("sendfile", "file", 3, 5)),
        (lambda s: s.settimeout(None), ("settimeout", None)),
        (lambda s: s.setblocking(True), ("setblocking", True)),
        (lambda s: s.shutdown(socket.SHUT_RDWR), ("shutdown", socket.SHUT_RDWR)),
        (lambda s: s.close(), ("close",)),
    ],
)
def test_anything_else_done_to_the_socket_sends_the_held_head_first(operation: Any, expected: Any) -> None:
    sock = Recorder()
    joined = HeadWithBody(sock)
    joined.sendall(b"head")
    operation(joined)
    assert sock.calls == [("sendall", b"head", 0), expected]


def test_a_send_with_flags_is_never_held_and_the_rest_is_the_sockets_own() -> None:
    sock = Recorder()
    joined = HeadWithBody(sock)
    joined.sendall(b"urgent", socket.MSG_OOB)
    joined.sendall(b"next")
    assert sock.calls == [("sendall", b"urgent", socket.MSG_OOB), ("sendall", b"next", 0)]
    assert joined.gettimeout() == 2.5


@pytest.fixture(params=["gunicorn", "granian"])
def served(
    request: pytest.FixtureRequest, redis_server: RedisServer, tmp_path: Path
) -> Iterator[tuple[str, int]]:
    """``token-service serve`` as shipped (gevent workers, or granian), one worker."""
    env = {
        "TOKEN_SERVICE_REDIS_URL": redis_server.url,
        "TOKEN_SERVICE_API_KEYS": API_KEY,
        "TOKEN_SERVICE_SERVER": request.param,
    }
    with serve_one_worker(env, tmp_path / "serve.log") as address:
        yield address


def read_head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    assert rest == b"", "a HEAD reply has no body"
    return head


@pytest.mark.real
@pytest.mark.slow
def test_replies_with_and_without_a_body_on_one_connection(served: tuple[str, int]) -> None:
    body = json.dumps({"scope": "payment.create", "subject": "user-1"}).encode()
    generate = request_bytes("POST", "/token/generate", body, {"Content-Type": "application/json"})
    with connect(served) as sock:
        sock.sendall(generate)
        issued = read_reply(sock)
        assert issued.status == 201
        assert issued.headers["content-length"] == str(len(issued.body))
        assert "token" in issued.json()

        sock.sendall(request_bytes("HEAD", "/healthz"))
        head = read_head(sock)
        assert head.startswith(b"HTTP/1.1 200 ")

        # a problem reply decided before the body was read (no service key)
        consume = request_bytes("POST", "/token/consume", b"{}", {"Content-Type": "application/json"})
        sock.sendall(consume)
        refused = read_reply(sock)
        assert refused.status == 401
        assert refused.headers["content-type"] == "application/problem+json"

        sock.sendall(generate)
        assert read_reply(sock).status == 201
