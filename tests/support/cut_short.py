"""A request over a raw socket whose body stops short of its Content-Length (then the client's FIN)."""

from __future__ import annotations

import socket


def post_cut_short(
    url: str, path: str, head: dict[str, str], body: bytes, declared: int
) -> tuple[int | None, dict[str, str], bytes]:
    """POST ``body`` with ``Content-Length: declared``, close our side, read the reply to its end.

    The status is None when the server closed without answering.
    """
    host, _, port = url.removeprefix("http://").partition(":")
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {declared}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in head.items()]
    reply = b""
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        conn.shutdown(socket.SHUT_WR)  # FIN: the rest of the declared body never comes
        try:
            while chunk := conn.recv(65536):
                reply += chunk
        except ConnectionResetError:
            pass
    if not reply:
        return None, {}, b""
    status_line, _, rest = reply.partition(b"\r\n")
    header_block, _, content = rest.partition(b"\r\n\r\n")
    headers = {}
    for line in header_block.decode("latin-1").split("\r\n"):
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, content
