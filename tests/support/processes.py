"""Real server processes for tests: redis-server and gunicorn on free ports.

Every process is started by a fixture and stopped by it; nothing depends on
what the machine happens to be running. Without a ``redis-server`` binary the
real-Redis tests skip with the reason, except under CI (``CI`` set), where a
missing server fails the run instead of passing it silently.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

REPO_ROOT = Path(__file__).resolve().parents[2]


def children(pid: int) -> set[int]:
    """The pids of a process's children (a gunicorn master's workers), from /proc."""
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return {int(part) for part in text.split()}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PortTaken(Exception):
    """Another process listens on the port a server was started on."""


def _listening_inodes(port: int) -> set[str]:
    """The inodes of the sockets listening on ``port`` (any address), from /proc/net/tcp{,6}."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(inode)
    return inodes


def _socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets a process and its descendants hold open."""
    found, pending = set(), [pid]
    while pending:
        current = pending.pop()
        try:
            pending.extend(children(current))
            fds = list(Path(f"/proc/{current}/fd").iterdir())
        except OSError:  # exited meanwhile
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                found.add(target[len("socket:[") : -1])
    return found


def listener_is_own(pid: int, port: int) -> bool | None:
    """Whether the socket listening on ``port`` is ``pid``'s or a descendant's; None if none listens."""
    listening = _listening_inodes(port)
    if not listening:
        return None
    return bool(listening & _socket_inodes(pid))


def start_serving(
    launch: Callable[[int], subprocess.Popen[Any]],
    ready: Callable[[int], bool],
    what: str,
    timeout_seconds: float = 60,
    attempts: int = 3,
) -> tuple[subprocess.Popen[Any], int]:
    """``launch(port)`` on a free port; (the process, its port) once ``ready(port)`` holds.

    free_port() only finds a port free for a moment: another xdist worker's server can take it
    before this one binds. This one then exits (gunicorn first retries for seconds) while
    ``ready`` would be answered by the other, so the process is ready only once the socket
    listening on the port is its own (or a child's: gunicorn's and nginx's workers). If another
    process holds it, this one is stopped and launched again on another free port.
    """
    for attempt in range(attempts):
        port = free_port()
        process = launch(port)
        try:
            _wait_serving(process, port, ready, what, timeout_seconds)
            return process, port
        except PortTaken:
            _stop(process)
            if attempt == attempts - 1:
                raise
        except BaseException:
            _stop(process)
            raise
    raise AssertionError("unreachable: the last attempt raises")


def _wait_serving(
    process: subprocess.Popen[Any], port: int, ready: Callable[[int], bool], what: str, timeout_seconds: float
) -> None:
    deadline = time.monotonic() + timeout_seconds
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        own = listener_is_own(process.pid, port)
        if own is False:
            raise PortTaken(f"{what}: port {port} is another process's")
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} (port {port})")
        if own:
            try:
                if ready(port):
                    return
            except Exception as exc:  # listening, not answering yet
                last_error = exc
        time.sleep(0.02)
    raise TimeoutError(f"timed out waiting for {what} on port {port}: {last_error!r}")


def _stop(process: subprocess.Popen[Any]) -> None:
    # SIGTERM first: a master killed outright can leave its workers behind (nginx's do)
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
    process.wait(timeout=20)


def start_gunicorn(app: str, env: dict[str, str], *options: str) -> tuple[subprocess.Popen[Any], int]:
    """gunicorn serving ``app`` (``module:callable`` of the checkout) with ``options``, ``env`` over
    this process's, its output dropped: (the process, its port) once /healthz answers."""

    def launch(port: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", *options, app],
            cwd=REPO_ROOT,
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    return start_serving(launch, answers_healthz(), "gunicorn")


def answers_healthz(path: str = "/healthz") -> Callable[[int], bool]:
    """A ``ready`` for start_serving: GET ``path`` on the port answers 200."""
    return lambda port: httpx.get(f"http://127.0.0.1:{port}{path}", timeout=1).status_code == 200


def redis_server_binary() -> str:
    binary = shutil.which("redis-server")
    if binary:
        return binary
    message = "redis-server is not installed: the real-Redis tests need it (apt-get install redis-server)"
    if os.environ.get("CI"):
        pytest.fail(message + " — CI must run them", pytrace=False)
    pytest.skip(message)


def wait_until(
    predicate, timeout_seconds: float = 30.0, interval_seconds: float = 0.02, what: str = "condition"
):  # type: ignore[no-untyped-def]
    # 30 s by default: on a loaded CI machine (load 10-18 on 2 cores) starting a process or reaching
    # a state can take many seconds; the wait ends as soon as the condition holds, so only a test
    # that fails anyway pays for the length
    deadline = time.monotonic() + timeout_seconds
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = predicate()
            if result:
                return result
        except Exception as exc:  # the thing we wait for is not up yet
            last_error = exc
        time.sleep(interval_seconds)
    raise TimeoutError(f"timed out waiting for {what}: {last_error!r}")


class RedisServer:
    """One redis-server process on a free loopback port, in its own temp dir."""

    def __init__(self, *extra_args: str, port: int | None = None) -> None:
        self.port = port or free_port()
        self.fixed_port = port is not None
        self.extra_args = list(extra_args)
        self.dir = Path(tempfile.mkdtemp(prefix="ts-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)  # type: ignore[arg-type]

    def start(self) -> RedisServer:
        attempts = 1 if self.fixed_port else 3
        for attempt in range(attempts):
            if self._start_once(last=attempt == attempts - 1):
                return self
            self.port = free_port()  # taken by another process in the meantime: another free one
        raise AssertionError("unreachable: the last attempt raises")

    def _start_once(self, *, last: bool) -> bool:
        """Start it; False if it exited because its port was not free any more."""
        args = [
            redis_server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--logfile",
            str(self.dir / "redis.log"),
            *self.extra_args,
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until(self._ping, what=f"redis-server on {self.port}")
        except TimeoutError:
            taken = self.process.poll() is not None and "Address already in use" in self._log()
            if last or not taken:
                self.kill()
                raise
            return False
        return True

    def _ping(self) -> bool:
        # free_port() only finds a port free for a moment: another test (another xdist worker,
        # another checkout's run) can take it first. Then this redis-server exits and the ping
        # would reach theirs, so the server that answers must be this one: its --dir.
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"redis-server on {self.port} exited: {self._log()}")
        with self.client(socket_timeout=0.5) as client:  # closed: no socket left for the GC to warn about
            if not client.ping():
                return False
            served = client.config_get("dir")
        answered = {
            str(name, "utf-8") if isinstance(name, bytes) else name: value for name, value in served.items()
        }
        here = answered.get("dir", b"")
        if Path(here.decode() if isinstance(here, bytes) else here).resolve() != self.dir.resolve():
            raise RuntimeError(f"port {self.port} is another redis-server's (its dir: {here!r})")
        return True

    def _log(self) -> str:
        log = self.dir / "redis.log"
        return log.read_text(errors="replace")[-500:] if log.exists() else ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
        shutil.rmtree(self.dir, ignore_errors=True)


class Gunicorn:
    """The service under gunicorn, as production runs it, on a free port."""

    def __init__(self, env: dict[str, str], workers: int = 2, extra_args: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.env = {**os.environ, **env}
        self.workers = workers
        self.extra_args = list(extra_args)
        self.log_path = Path(tempfile.mkstemp(prefix="ts-gunicorn-", suffix=".log")[1])
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Gunicorn:
        def launch(port: int) -> subprocess.Popen[bytes]:
            self.port = port
            args = [
                sys.executable,
                "-m",
                "gunicorn",
                "--config",
                "python:token_service.server.gunicorn_conf",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                str(self.workers),
                *self.extra_args,
                "token_service:create_app()",
            ]
            with self.log_path.open("wb") as log:
                return subprocess.Popen(
                    args, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT
                )

        try:
            self.process, self.port = start_serving(launch, answers_healthz(), "gunicorn")
        except (PortTaken, RuntimeError, TimeoutError) as exc:
            raise type(exc)(f"{exc}: {self.log()}") from exc
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def worker_pids(self) -> set[int]:
        """The pids of the worker processes serving requests."""
        assert self.process is not None
        return children(self.process.pid)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Granian(Gunicorn):
    """The service under granian (``token-service serve --server granian``), on a free port.

    The same settings, log and stop as :class:`Gunicorn`; ``extra_args`` are ``serve``'s, not
    gunicorn's. ``process`` is the ``serve`` process, which drains and then stops granian.
    """

    def start(self) -> Granian:
        def launch(port: int) -> subprocess.Popen[bytes]:
            self.port = port
            args = [sys.executable, "-m", "token_service.server.cli", "serve", "--server", "granian"]
            args += ["--host", "127.0.0.1", "--port", str(port), "--workers", str(self.workers)]
            args += self.extra_args
            with self.log_path.open("wb") as log:
                return subprocess.Popen(
                    args, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT
                )

        try:
            self.process, self.port = start_serving(launch, answers_healthz(), "granian")
        except (PortTaken, RuntimeError, TimeoutError) as exc:
            raise type(exc)(f"{exc}: {self.log()}") from exc
        return self

    def worker_pids(self) -> set[int]:
        # serve -> granian's main process -> its workers
        assert self.process is not None
        return {pid for main in children(self.process.pid) for pid in children(main)}


# The servers `token-service serve` runs; the edge tests that hold for both are parametrized over it.
SERVERS: dict[str, type[Gunicorn]] = {"gunicorn": Gunicorn, "granian": Granian}


@contextmanager
def serve_one_worker(env_overrides: dict[str, str], log: Path) -> Iterator[tuple[str, int]]:
    """``token-service serve`` as shipped (gevent workers) with one worker, on a free port.

    The environment is this process's without any TOKEN_SERVICE_*, GUNICORN_* or
    WEB_CONCURRENCY, plus ``env_overrides``; the server's output goes to ``log``.
    """
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("TOKEN_SERVICE_", "GUNICORN_", "WEB_CONCURRENCY"))
    }
    env.update(env_overrides)

    def launch(port: int) -> subprocess.Popen[bytes]:
        args = [sys.executable, "-m", "token_service.server.cli", "serve", "--workers", "1"]
        args += ["--host", "127.0.0.1", "--port", str(port)]
        with log.open("wb") as out:
            return subprocess.Popen(args, env=env, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT)

    server, port = start_serving(launch, answers_healthz(), "token-service serve")
    try:
        yield ("127.0.0.1", port)
    finally:
        server.terminate()
        server.wait(timeout=30)
