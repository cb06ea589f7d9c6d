"""The test servers' port race (tests/support/processes.py's start_serving), which parallel runs meet.

free_port() finds a port free for a moment; under pytest-xdist another worker's server can take
it first. Then the server answering on it is not the one just started, and the fixture must
notice and start its own on another port, never hand the test someone else's.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.support import processes
from tests.support.processes import PortTaken, listener_is_own, start_serving


def http_server(port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def answers(port: int) -> bool:
    return httpx.get(f"http://127.0.0.1:{port}/", timeout=1).status_code == 200


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another process's server listens on (and answers 200 on, like the one to start)."""
    process, port = start_serving(http_server, answers, "the other server")
    yield port
    process.terminate()
    process.wait(timeout=20)


def test_a_port_another_server_won_is_left_for_a_free_one(
    taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    offered = iter([taken_port])
    real_free_port = processes.free_port
    monkeypatch.setattr(processes, "free_port", lambda: next(offered, None) or real_free_port())
    launched: list[subprocess.Popen[bytes]] = []

    def launch(port: int) -> subprocess.Popen[bytes]:
        launched.append(http_server(port))
        return launched[-1]

    process, port = start_serving(launch, answers, "the server")
    try:
        assert port != taken_port
        assert len(launched) == 2
        assert launched[-1] is process
        assert launched[0].poll() is not None  # the first, which lost the race, is not left behind
        assert listener_is_own(process.pid, port) is True
        assert listener_is_own(process.pid, taken_port) is False
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_without_another_free_port_it_says_so(taken_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes, "free_port", lambda: taken_port)
    launched: list[subprocess.Popen[bytes]] = []

    def launch(port: int) -> subprocess.Popen[bytes]:
        launched.append(http_server(port))
        return launched[-1]

    with pytest.raises(PortTaken, match=f"port {taken_port} is another process's"):
        start_serving(launch, answers, "the server", attempts=2)
    assert len(launched) == 2
    assert all(process.poll() is not None for process in launched)


def test_nothing_listening_is_neither_own_nor_taken() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening
        assert listener_is_own(1, sock.getsockname()[1]) is None
