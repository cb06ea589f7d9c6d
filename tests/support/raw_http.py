"""HTTP/1.1 over raw sockets: for requests no HTTP client sends (half-sent, chunked, malformed, slow)."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Reply:
    status: int
    headers: dict[str, str] = field(default_factory=dict)  # names lower-cased
    body: bytes = b""

    def json(self) -> Any:
        return json.loads(self.body)


def connect(address: tuple[str, int], source: str | None = None, timeout: float = 30.0) -> socket.socket:
    """A connection, from ``source`` (another loopback address, e.g. 127.0.0.2) when given."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        if source:
            sock.bind((source, 0))
        sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return sock


def request_bytes(
    method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body is not None and not any(name.lower() == "transfer-encoding" for name in headers or {}):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def chunked(body: bytes, size: int = 4096) -> bytes:
    parts = [
        b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size]) for i in range(0, len(body), size)
    ]
    return b"".join(parts) + b"0\r\n\r\n"


def read_reply(sock: socket.socket, deadline_seconds: float = 30.0) -> Reply:
    """One response (Content-Length framed, as the service and gunicorn answer); raises on timeout/EOF.

    30 s by default (as ``connect``): a loaded CI machine can take seconds to answer; a reply that
    comes sooner ends the wait."""
    deadline = time.monotonic() + deadline_seconds
    data = b""
    while b"\r\n\r\n" not in data:
        data += _recv(sock, deadline)
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        rest += _recv(sock, deadline)
    return Reply(int(status_line.split()[1]), headers, rest[:length])


def _recv(sock: socket.socket, deadline: float) -> bytes:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("no complete reply in time")
    sock.settimeout(remaining)
    chunk = sock.recv(65536)
    if not chunk:
        raise ConnectionError("closed before a complete reply")
    return chunk


def exchange(
    address: tuple[str, int], raw: bytes, deadline_seconds: float = 30.0, source: str | None = None
) -> Reply:
    with connect(address, source, deadline_seconds) as sock:
        sock.sendall(raw)
        return read_reply(sock, deadline_seconds)
