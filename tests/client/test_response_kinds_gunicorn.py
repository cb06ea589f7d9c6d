"""Every kind of response under real gunicorn and a real redis-server, for ``@require_token`` and the
Idempotency-Key middleware (tests/client/response_kinds_app.py): ``send_file()`` of a file on disk,
HEAD, streams, direct passthrough, a client that leaves half-way, transient statuses.

Each runs the view once, never answers 500, never leaves the token (or key) held, and
duplicates get the first answer (a body over the storage cap as status and headers with
``Idempotent-Body-Omitted``). Then the memory bound: a 64 MB stream raises the worker's
resident-set high-water mark (``VmHWM``, reset before through ``/proc/<pid>/clear_refs``)
by less than twice the storage cap.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from tests.support.processes import (
    RedisServer,
    children,
    start_gunicorn,
    wait_until,
)
from token_service.client import TokenClient

pytestmark = [pytest.mark.real, pytest.mark.slow]

KEY_HEADERS = {"Authorization": "Bearer client-a"}
SCOPE = "report.create"  # response_kinds_app's (importing it needs its environment)
CHUNK = 64 * 1024  # its stream's chunk
FILE_BYTES = 4 * 1024 * 1024  # the file it sends: more than the socket buffers hold


@dataclass
class App:
    url: str
    pid: int  # gunicorn's master
    report: bytes


def start_app(redis_url: str, folder: Path, workers: int, cap: int) -> tuple[subprocess.Popen[bytes], App]:
    report = b"%PDF-1.4 " + os.urandom(FILE_BYTES - 9)
    path = folder / "report.pdf"
    path.write_bytes(report)

    env = {"TEST_REDIS_URL": redis_url, "TEST_REPORT_PATH": str(path), "TEST_STORAGE_CAP": str(cap)}
    process, port = start_gunicorn(
        "tests.client.response_kinds_app:app", env, *("--workers", str(workers), "--timeout", "60")
    )
    url = f"http://127.0.0.1:{port}"
    return process, App(url, process.pid, report)


@pytest.fixture(scope="module")
def app(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    process, started = start_app(redis_server.url, tmp_path_factory.mktemp("kinds"), 2, 64 * 1024)
    yield started
    process.terminate()
    process.wait(20)


@pytest.fixture
def tokens(real_redis: redis.Redis) -> Iterator[TokenClient]:
    with TokenClient.from_redis(real_redis) as client:
        yield client


def runs(store: redis.Redis, path: str) -> int:
    return int(store.get(f"runs:{path}") or 0)


def guard_headers(tokens: TokenClient, prefix: str, name: str) -> dict[str, str]:
    """A fresh token (``/token``) or key ``name`` (``/key``) with the client's credentials."""
    if prefix == "/token":
        return {"Idempotency-Token": tokens.generate(SCOPE).token}
    return {"Idempotency-Key": f'"{name}"', **KEY_HEADERS}


def send(app: App, path: str, headers: dict[str, str], method: str = "POST") -> httpx.Response:
    return httpx.request(method, app.url + path, headers=headers, timeout=60)


# -- send_file() of a file on disk -------------------------------------------------------------


def test_a_file_behind_require_token_runs_once_and_never_answers_500(
    app: App, tokens: TokenClient, real_redis: redis.Redis
) -> None:
    token = tokens.generate(SCOPE).token
    answers = [send(app, "/token/file", {"Idempotency-Token": token}) for _ in range(3)]
    assert [answer.status_code for answer in answers] == [200, 200, 200]
    assert answers[0].content == app.report
    assert "idempotent-replayed" not in answers[0].headers
    assert tokens.verify(token).state == "SUCCEEDED"
    for replay in answers[1:]:
        assert replay.headers["Idempotent-Replayed"] == "true"
        assert replay.headers["Idempotent-Body-Omitted"] == str(FILE_BYTES)
        assert replay.headers["Content-Type"] == "application/pdf"
        assert replay.content == b""
    assert runs(real_redis, "/token/file") == 1


def test_a_file_behind_the_middleware_runs_once_and_never_answers_500(
    app: App, real_redis: redis.Redis
) -> None:
    headers = {"Idempotency-Key": '"file-1"', **KEY_HEADERS}
    answers = [send(app, "/key/file", headers) for _ in range(3)]
    assert [answer.status_code for answer in answers] == [200, 200, 200]
    assert answers[0].content == app.report
    for replay in answers[1:]:
        assert replay.headers["Idempotent-Replayed"] == "true"
        assert replay.headers["Idempotent-Body-Omitted"] == str(FILE_BYTES)
        assert replay.content == b""
    assert runs(real_redis, "/key/file") == 1


def test_head_of_a_file_runs_once_and_is_recorded(
    app: App, tokens: TokenClient, real_redis: redis.Redis
) -> None:
    token = tokens.generate(SCOPE).token
    head = send(app, "/token/file", {"Idempotency-Token": token}, method="HEAD")
    assert head.status_code == 200
    assert head.headers["Content-Length"] == str(FILE_BYTES)
    assert tokens.verify(token).state == "SUCCEEDED"
    again = send(app, "/token/file", {"Idempotency-Token": token})
    assert (again.status_code, again.headers["Idempotent-Replayed"]) == (200, "true")
    assert again.headers["Idempotent-Body-Omitted"] == str(FILE_BYTES)
    assert runs(real_redis, "/token/file") == 1


def _leave_half_way(app: App, path: str, headers: dict[str, str]) -> int:
    """Send the request, read part of the answer, then reset the connection; how much was read."""
    port = int(app.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Length: 0"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        got = 0
        while got < 256 * 1024:
            chunk = sock.recv(65536)
            assert chunk, "the server closed before sending much"
            got += len(chunk)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    return got


def test_a_client_that_leaves_half_way_never_leaves_the_token_held(
    app: App, tokens: TokenClient, real_redis: redis.Redis
) -> None:
    token = tokens.generate(SCOPE).token
    assert _leave_half_way(app, "/token/file", {"Idempotency-Token": token}) < FILE_BYTES
    # the view ran: what it answered is recorded (its body omitted), not left PROCESSING
    wait_until(lambda: tokens.verify(token).state != "PROCESSING", 30, what="the token to be settled")
    assert tokens.verify(token).state == "SUCCEEDED"
    again = send(app, "/token/file", {"Idempotency-Token": token})
    assert (again.status_code, again.headers["Idempotent-Replayed"]) == (200, "true")
    assert runs(real_redis, "/token/file") == 1

    headers = {"Idempotency-Key": '"left-1"', **KEY_HEADERS}
    _leave_half_way(app, "/key/file", headers)
    wait_until(
        lambda: (
            next(value for key in real_redis.keys("ts:ik:*") if (value := real_redis.get(key)))[:1] == b"S"
        ),
        30,
        what="the key's response to be stored",
    )
    again = send(app, "/key/file", headers)
    assert (again.status_code, again.headers["Idempotent-Replayed"]) == (200, "true")
    assert runs(real_redis, "/key/file") == 1


# -- streams and direct passthrough ---------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["/token", "/key"])
def test_streams_and_direct_passthrough_are_replayed(
    app: App, tokens: TokenClient, real_redis: redis.Redis, prefix: str
) -> None:
    small, large, passthrough = (guard_headers(tokens, prefix, name) for name in ("s", "l", "p"))
    for _ in range(2):
        answer = send(app, f"{prefix}/stream?chunks=2&chunk=1000", small)
        assert (answer.status_code, answer.content) == (200, b"x" * 2000)
        answer = send(app, f"{prefix}/stream?chunks=4", large)
        assert (answer.status_code, len(answer.content)) == (
            200,
            0 if answer.headers.get("Idempotent-Replayed") else 4 * CHUNK,
        )
        answer = send(app, f"{prefix}/passthrough", passthrough)
        assert (answer.status_code, answer.content) == (200, b"part one, part two")
    assert answer.headers["Idempotent-Replayed"] == "true"
    assert send(app, f"{prefix}/stream?chunks=4", large).headers["Idempotent-Body-Omitted"] == str(4 * CHUNK)
    assert runs(real_redis, f"{prefix}/stream") == 2  # the small one and the large one, once each
    assert runs(real_redis, f"{prefix}/passthrough") == 1


# -- transient statuses ---------------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize("prefix", ["/token", "/key"])
def test_a_429_or_503_is_not_replayed(
    app: App, tokens: TokenClient, real_redis: redis.Redis, prefix: str, status: int
) -> None:
    token = tokens.generate(SCOPE).token
    headers = (
        {"Idempotency-Token": token}
        if prefix == "/token"
        else {"Idempotency-Key": f'"s{status}"', **KEY_HEADERS}
    )
    path = f"{prefix}/status?status={status}"
    for attempt in range(1, 4):
        answer = send(app, path, headers)
        assert answer.status_code == status
        assert "idempotent-replayed" not in answer.headers
        assert runs(real_redis, f"{prefix}/status") == attempt
    if prefix == "/token":
        assert tokens.verify(token).state == "ISSUED"  # freed for the retry, not PROCESSING
    else:
        assert real_redis.keys("ts:ik:*") == []
    # a final answer is then stored and replayed
    assert send(app, f"{prefix}/status?status=201", headers).status_code == 201
    assert send(app, f"{prefix}/status?status=201", headers).headers["Idempotent-Replayed"] == "true"
    assert runs(real_redis, f"{prefix}/status") == 4


# -- memory: a 64 MB stream under a worker's resident set ------------------------------------------

MEMORY_CAP = 4 * 1024 * 1024
STREAM_CHUNKS = 1024  # of CHUNK (64 KiB): 64 MiB


def _kib(pid: int, field: str) -> int:
    found = re.search(rf"^{field}:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
    assert found is not None
    return int(found.group(1))


def _streamed(app: App, path: str, headers: dict[str, str], chunks: int) -> int:
    received = 0
    with httpx.stream("POST", f"{app.url}{path}?chunks={chunks}", headers=headers, timeout=120) as answer:
        assert answer.status_code == 200
        for part in answer.iter_raw():
            received += len(part)
    return received


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux /proc only")
def test_a_64_mb_stream_grows_the_worker_by_less_than_twice_the_cap(
    redis_server: RedisServer, real_redis: redis.Redis, tmp_path: Path
) -> None:
    process, app = start_app(redis_server.url, tmp_path, 1, MEMORY_CAP)
    try:
        (worker,) = children(app.pid)
        with TokenClient.from_redis(real_redis) as tokens:
            for prefix in ("/token", "/key"):
                # warm up: the same path with a stream just over the cap (imports, pools, allocator arenas)
                assert (
                    _streamed(
                        app,
                        f"{prefix}/stream",
                        guard_headers(tokens, prefix, "warm"),
                        2 * MEMORY_CAP // CHUNK,
                    )
                    > MEMORY_CAP
                )
                before = _kib(worker, "VmRSS")
                try:
                    Path(f"/proc/{worker}/clear_refs").write_text("5")  # VmHWM := VmRSS
                except PermissionError:
                    pytest.skip("this machine does not let us reset a process's high-water mark")
                received = _streamed(
                    app, f"{prefix}/stream", guard_headers(tokens, prefix, "big"), STREAM_CHUNKS
                )
                growth = (_kib(worker, "VmHWM") - before) * 1024
                assert received == STREAM_CHUNKS * CHUNK
                mib = growth / 2**20
                print(
                    f"{prefix}: 64 MiB streamed, worker peak RSS +{mib:.2f} MiB (cap {MEMORY_CAP >> 20} MiB)"
                )
                assert growth < 2 * MEMORY_CAP, f"{prefix}: the worker grew {growth} bytes, cap {MEMORY_CAP}"
    finally:
        process.terminate()
        process.wait(20)
