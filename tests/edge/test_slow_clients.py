"""Slow and idle clients cannot stop the service: the figure, against ``token-service serve`` as shipped,
under gunicorn (facing the clients itself) and under granian behind the nginx recipe (its supported
deployment: granian alone holds no body deadline, tests/edge/test_gunicorn_edge.py).

An attacker holds 100 idle sockets and 100 half-sent requests (50 stopped
mid-head, 50 mid-body) open against the default configuration on a real
Redis, reconnecting whatever the server closes. Meanwhile 100 ``/healthz``
and 100 ``POST /token/generate`` probes, each on a fresh connection from its
own loopback address (so the default issuance limits apply as to real
users): at least 99% must be answered within 2 s each. What the attacker's
sockets get back is only ever problem+json (408 for a body that never
came, or a reset from nginx), never an HTML page.
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.nginx import Nginx
from tests.support.processes import REPO_ROOT, RedisServer, free_port, wait_until
from tests.support.raw_http import connect, read_reply, request_bytes
from tests.support.service import API_KEY

pytestmark = [pytest.mark.real, pytest.mark.slow]

ATTACKER = "127.0.0.66"
IDLE, HALF_HEAD, HALF_BODY = 100, 50, 50
PROBES = 100  # of each route
PROBE_SECONDS = 2.0
PACE_SECONDS = 0.05  # between probes: the probing outlasts the server's 5 s head deadline

HALF_HEAD_BYTES = b"POST /token/generate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
HALF_BODY_BYTES = (
    b"POST /token/generate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
    b"Content-Length: 200\r\n\r\n" + b'{"scope": "slow' + b"w" * 20
)


class Attacker(threading.Thread):
    """Keeps IDLE + HALF_HEAD + HALF_BODY sockets open, reconnecting any the server closes."""

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.stopping = threading.Event()
        self.selector = selectors.DefaultSelector()
        self.open_sockets = 0
        self.reconnects = 0
        self.replies: list[bytes] = []  # every byte the server sent, per socket closed
        self.errors: list[str] = []

    def _open(self, kind: bytes) -> None:
        try:
            sock = connect(self.address, ATTACKER, timeout=5)
            if kind:
                sock.sendall(kind)
        except OSError as exc:
            self.errors.append(repr(exc))
            return
        sock.setblocking(False)
        self.selector.register(sock, selectors.EVENT_READ, [kind, b""])
        self.open_sockets += 1

    def run(self) -> None:
        for kind, count in ((b"", IDLE), (HALF_HEAD_BYTES, HALF_HEAD), (HALF_BODY_BYTES, HALF_BODY)):
            for _ in range(count):
                self._open(kind)
        while not self.stopping.is_set():
            for key, _ in self.selector.select(timeout=0.1):
                sock, state = key.fileobj, key.data
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if data:
                    state[1] += data
                    continue
                # closed by the server: note what it said, and come straight back
                self.selector.unregister(sock)
                sock.close()
                self.open_sockets -= 1
                if state[1]:
                    self.replies.append(state[1])
                self.reconnects += 1
                self._open(state[0])
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]


def probe(address: tuple[str, int], raw: bytes, source: str) -> int | None:
    """The status of one request on a fresh connection, or None if not answered within PROBE_SECONDS."""
    started = time.monotonic()
    try:
        with connect(address, source, PROBE_SECONDS) as sock:
            sock.sendall(raw)
            return read_reply(sock, PROBE_SECONDS - (time.monotonic() - started)).status
    except (OSError, ValueError):
        return None


@dataclass
class Served:
    address: tuple[str, int]  # where clients connect: the service, or nginx in front of it
    log: Path  # the service's
    behind_nginx: bool


@pytest.fixture(params=["gunicorn", "granian-behind-nginx"])
def served(request: pytest.FixtureRequest, redis_server: RedisServer, tmp_path: Path) -> Iterator[Served]:
    """``token-service serve`` with its defaults; only the Redis URL and a service key set (and,
    for granian, the one proxy in front of it declared)."""
    behind_nginx = request.param == "granian-behind-nginx"
    port = free_port()
    log = tmp_path / "serve.log"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("TOKEN_SERVICE_", "GUNICORN_", "WEB_CONCURRENCY"))
    }
    env.update({"TOKEN_SERVICE_REDIS_URL": redis_server.url, "TOKEN_SERVICE_API_KEYS": API_KEY})
    command = [sys.executable, "-m", "token_service.server.cli", "serve"]
    if behind_nginx:
        env["TOKEN_SERVICE_TRUSTED_PROXY_HOPS"] = "1"
        command += ["--server", "granian"]
    with log.open("wb") as out:
        server = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            cwd=REPO_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    nginx = Nginx(tmp_path / "nginx", port) if behind_nginx else None
    try:
        wait_until(
            lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200,
            timeout_seconds=60,
            what="token-service serve",
        )
        address = nginx.start().address if nginx else ("127.0.0.1", port)
        yield Served(address, log, behind_nginx)
    finally:
        if nginx:
            nginx.stop()
        server.terminate()
        server.wait(timeout=30)


def test_idle_and_half_sent_sockets_do_not_stop_the_service(served: Served) -> None:
    address, log = served.address, served.log
    attacker = Attacker(address)
    attacker.start()
    try:
        wait_until(
            lambda: attacker.open_sockets == IDLE + HALF_HEAD + HALF_BODY,
            timeout_seconds=30,
            what="the attacker's sockets",
        )
        assert attacker.errors == []
        healthz = request_bytes("GET", "/healthz")
        generate = request_bytes(
            "POST",
            "/token/generate",
            json.dumps({"scope": "probe"}).encode(),
            {"Content-Type": "application/json"},
        )
        results: dict[str, list[int | None]] = {"healthz": [], "generate": []}
        for i in range(PROBES):
            source = f"127.0.1.{1 + i % 50}"  # 2 generates per address: far under the default limits
            results["healthz"].append(probe(address, healthz, source))
            time.sleep(PACE_SECONDS)
            results["generate"].append(probe(address, generate, source))
            time.sleep(PACE_SECONDS)
        if served.behind_nginx:
            # nginx resets a connection whose head or body is late (reset_timedout_connection on)
            wait_until(lambda: attacker.reconnects > 0, timeout_seconds=60, what="a reset")
        else:
            # the half-sent bodies are answered (408) once their deadline passes
            wait_until(
                lambda: any(b" 408 " in reply for reply in attacker.replies), timeout_seconds=30, what="a 408"
            )
    finally:
        attacker.stopping.set()
        attacker.join(timeout=30)

    answered = {
        route: sum(status == (200 if route == "healthz" else 201) for status in statuses)
        for route, statuses in results.items()
    }
    assert answered["healthz"] >= 0.99 * PROBES, results["healthz"]
    assert answered["generate"] >= 0.99 * PROBES, results["generate"]
    # the server did close the attacker's sockets (head deadline, body deadline), and the attacker came back
    assert attacker.reconnects > 0
    for reply in attacker.replies:
        head = reply.split(b"\r\n\r\n", 1)[0].lower()
        assert b"content-type: application/problem+json" in head, reply[:300]
        assert b"text/html" not in reply
        assert reply.startswith(b"HTTP/1.1 408 "), reply[:300]
    text = log.read_text(errors="replace")
    assert "WORKER TIMEOUT" not in text
    assert "Traceback" not in text
