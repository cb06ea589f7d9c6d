"""The processes a benchmark run owns: a redis-server and gunicorn servers on free ports.

Everything is started here and stopped here; the machine's own Redis (6379)
is never touched.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

REPO_ROOT = Path(__file__).resolve().parent.parent

# One gunicorn command line for the service and for the hand-written baseline:
# the project's own config file (gevent workers, keepalive), the same worker
# count, only the application (and, in the worker-class comparison, the
# ``--worker-class``) differs.
GUNICORN_FLAGS = ("--config", "python:token_service.server.gunicorn_conf")
# The worker classes compared (same app, same worker count); gevent is the config's default.
WORKER_CLASSES: dict[str, tuple[str, ...]] = {
    "sync": ("--worker-class", "sync"),
    "gthread": ("--worker-class", "gthread", "--threads", "4"),
    "gevent": (),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(predicate: Callable[[], Any], timeout_seconds: float, what: str) -> None:
    deadline = time.monotonic() + timeout_seconds
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception as exc:  # the thing is not up yet
            last = exc
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}: {last!r}")


_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU time the processes have used so far (Linux /proc)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a worker that exited: its time is lost, the run shows it as cheaper
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _TICKS_PER_SECOND


def cpu_seconds_precise(pids: Sequence[int]) -> float:
    """CPU time the processes' threads have run so far, in scheduler nanoseconds.

    /proc/<pid>/task/<tid>/schedstat's first field: fine enough for rounds of
    a few milliseconds, where :func:`cpu_seconds`'s clock ticks (10 ms) are
    not. Falls back to :func:`cpu_seconds` where the kernel has no schedstat.
    """
    total_ns = 0
    for pid in pids:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
            for task in tasks:
                total_ns += int((task / "schedstat").read_text().split()[0])
        except FileNotFoundError:
            continue  # exited (or a thread that just ended): as in cpu_seconds
        except (OSError, ValueError, IndexError):
            return cpu_seconds(pids)
    return total_ns / 1e9


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def require(binary: str, hint: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise SystemExit(f"benchmarks: {binary} is not installed ({hint})")
    return path


class RedisServer:
    """A private redis-server: free port, temp dir, no persistence."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="ts-bench-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs: Any) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def start(self) -> RedisServer:
        binary = require("redis-server", "apt-get install redis-server")
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir)]
        args += ["--save", "", "--appendonly", "no", "--logfile", str(self.dir / "redis.log")]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: self.client(socket_timeout=0.5).ping(), 30, f"redis-server on {self.port}")
        return self

    def pids(self) -> list[int]:
        return [self.process.pid] if self.process else []

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


class CallgrindRedis(RedisServer):
    """A private redis-server under valgrind's callgrind: instructions counted, not timed."""

    def start(self) -> CallgrindRedis:
        valgrind = require("valgrind", "apt-get install valgrind")
        args = [valgrind, "--tool=callgrind", f"--callgrind-out-file={self.dir}/callgrind.out"]
        args += [require("redis-server", "apt-get install redis-server"), "--port", str(self.port)]
        args += ["--bind", "127.0.0.1", "--dir", str(self.dir), "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(
            lambda: self.client(socket_timeout=5).ping(), 120, f"redis-server under valgrind on {self.port}"
        )
        return self

    def instructions(self) -> int:
        """Instructions since the last call (dump the counters, then zero them)."""
        for dump in self.dir.glob("callgrind.out*"):
            dump.unlink()
        subprocess.run(["callgrind_control", "--dump", str(self.pids()[0])], capture_output=True, check=True)
        (dump,) = self.dir.glob("callgrind.out*")
        match = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(), re.MULTILINE)
        if match is None:
            raise RuntimeError(f"no instruction total in {dump}")
        subprocess.run(["callgrind_control", "--zero", str(self.pids()[0])], capture_output=True, check=True)
        return int(match.group(1))


class Gunicorn:
    """One WSGI app under gunicorn with :data:`GUNICORN_FLAGS` and ``workers`` workers."""

    def __init__(self, app: str, env: dict[str, str], workers: int, extra: Sequence[str] = ()) -> None:
        self.app = app
        self.port = free_port()
        self.env = {**os.environ, **env, "PYTHONPATH": str(REPO_ROOT)}
        self.workers = workers
        self.extra = list(extra)
        self.log = Path(tempfile.mkstemp(prefix="ts-bench-gunicorn-", suffix=".log")[1])
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "gunicorn",
            *GUNICORN_FLAGS,
            "--bind",
            f"127.0.0.1:{self.port}",
            "--workers",
            str(self.workers),
            *self.extra,
            self.app,
        ]

    def start(self) -> Gunicorn:
        # Access-log lines go to /dev/null (both servers pay for writing them);
        # errors go to a file so a failed start can be shown.
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                self.command(), env=self.env, stdout=subprocess.DEVNULL, stderr=log, cwd=REPO_ROOT
            )

        def up() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise SystemExit(f"benchmarks: gunicorn {self.app} exited:\n{self.log.read_text()}")
            return self.healthy()

        # 60 s: the quick harness runs in CI at load 10-18, where a start can take tens of seconds
        wait_until(up, 60, f"gunicorn {self.app}")
        return self

    def healthy(self) -> bool:
        """``/healthz`` answers 200 (a subclass serving TLS asks over TLS)."""
        with urllib.request.urlopen(self.url + "/healthz", timeout=1) as reply:  # noqa: S310
            return bool(reply.status == 200)

    def pids(self) -> list[int]:
        """The master and its workers."""
        return [self.process.pid, *children(self.process.pid)] if self.process else []

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.unlink(missing_ok=True)


class Uvicorn(Gunicorn):
    """An ASGI app under uvicorn with ``workers`` processes (the FastAPI baseline's server)."""

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "uvicorn",
            self.app,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            str(self.workers),
            "--no-access-log",
            "--log-level",
            "warning",
            *self.extra,
        ]


class GranianServe(Gunicorn):
    """The service under granian: ``token-service serve --server granian`` with ``workers`` workers.

    The command as shipped: its blocking threads, timeouts and logging are granian_serve's.
    """

    def command(self) -> list[str]:
        serve = ["serve", "--server", "granian", "--host", "127.0.0.1", "--port", str(self.port)]
        return [sys.executable, "-m", "token_service.server.cli", *serve, "--workers", str(self.workers)]

    def pids(self) -> list[int]:
        """``serve``, granian's main process and its workers."""
        if not self.process:
            return []
        found = [self.process.pid]
        for pid in found:  # grows as it goes: every descendant
            found += children(pid)
        return found
