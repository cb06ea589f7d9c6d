"""A whole gunicorn worker's instructions per request: ``python -m benchmarks.server_callgrind``.

The server included. ``routes_callgrind`` counts the application alone, called in process. What a
worker spends on a request also holds gunicorn's side (parsing the head,
the environ, writing the reply), the worker class's (gevent's hub and
greenlet switches, or sync's accept and close per request) and the sockets'
Python layers. Here each target runs under gunicorn with one worker under
``valgrind --tool=callgrind`` (``--trace-children``: the worker is counted);
wrk sends the benchmark's own requests over one connection for ``--seconds``
after a warm-up, with the worker's counters zeroed just before
(``callgrind_control``); the worker's instructions over the requests wrk
completed are its instructions per request. The kernel's work (system calls,
TCP) is not counted, nor redis-server's. One connection, so that each request
meets the worker in the same state: with two, how often the hub finds both
ready at once depends on timing, and the counts moved by ~5% between runs.

Targets: ``service`` (the shipped config: gevent workers) and
``service-sync``; ``baseline-sync`` (the hand-written Flask app on sync
workers, the HTTP budget's reference) and ``baseline``; ``floor`` and
``floor-sync``, a WSGI app that reads the body and answers a fixed reply:
what gunicorn and the worker class cost a request with no application.

``--label NAME`` keeps the figures in ``server_callgrind.json`` under NAME.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from benchmarks import suite
from benchmarks.procs import REPO_ROOT, WORKER_CLASSES, Gunicorn, RedisServer, children, require, wait_until

__all__ = ["TARGETS", "floor_app", "main", "measure"]

TARGETS = ("service", "service-sync", "baseline", "baseline-sync", "floor", "floor-sync")
DEFAULT_TARGETS = ("service", "baseline-sync", "floor", "floor-sync")
OUT = Path(__file__).resolve().parent / "server_callgrind.json"
_FLOOR_REPLY = b'{"token":"x","scope":"payment.create","ttl_seconds":900}'


def floor_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """No application: the body read, a fixed reply (201 to a POST, 200 to /healthz)."""
    environ["wsgi.input"].read()
    status = "201 CREATED" if environ["REQUEST_METHOD"] == "POST" else "200 OK"
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(_FLOOR_REPLY)))])
    return [_FLOOR_REPLY]


class CallgrindGunicorn(Gunicorn):
    """gunicorn (one worker) under callgrind; each worker's counters in ``<dir>/cg.<pid>``."""

    def __init__(self, app: str, env: dict[str, str], extra: tuple[str, ...]) -> None:
        super().__init__(app, env, 1, extra)
        self.dumps = Path(tempfile.mkdtemp(prefix="ts-bench-server-cg-"))

    def command(self) -> list[str]:
        valgrind = [require("valgrind", "apt-get install valgrind"), "--tool=callgrind"]
        valgrind += ["--trace-children=yes", f"--callgrind-out-file={self.dumps}/cg.%p"]
        # a worker under valgrind boots and answers ~50x slower: gunicorn's 30 s would kill it
        return [*valgrind, *super().command(), "--timeout", "600"]

    def start(self) -> CallgrindGunicorn:
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                self.command(), env=self.env, stdout=subprocess.DEVNULL, stderr=log, cwd=REPO_ROOT
            )
        wait_until(self.healthy, 600, f"gunicorn {self.app} under valgrind")
        return self

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.dumps, ignore_errors=True)

    def worker_instructions(self, action: Callable[[], int]) -> tuple[int, int]:
        """(instructions of the worker while ``action`` ran, what ``action`` returned)."""
        assert self.process is not None
        (worker,) = children(self.process.pid)
        control = require("callgrind_control", "apt-get install valgrind")
        subprocess.run([control, "--zero", str(worker)], capture_output=True, check=True)
        result = action()
        for old in self.dumps.glob(f"cg.{worker}*"):
            old.unlink()
        subprocess.run([control, "--dump", str(worker)], capture_output=True, check=True)
        total = 0
        for dump in self.dumps.glob(f"cg.{worker}*"):
            match = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(), re.MULTILINE)
            total += int(match.group(1)) if match else 0
        return total, result


def _server(target: str, redis_url: str) -> CallgrindGunicorn:
    app, _, worker_class = target.partition("-")
    flags = WORKER_CLASSES[worker_class or "gevent"]
    if app == "service":
        return CallgrindGunicorn(
            suite.SERVICE_APP, {**suite.SERVICE_ENV, "TOKEN_SERVICE_REDIS_URL": redis_url}, flags
        )
    if app == "baseline":
        return CallgrindGunicorn(suite.BASELINE_APP, {"BENCH_REDIS_URL": redis_url}, flags)
    return CallgrindGunicorn("benchmarks.server_callgrind:floor_app", {}, flags)


def measure(targets: Iterable[str], endpoints: Iterable[str], seconds: float) -> dict[str, dict[str, int]]:
    """Instructions per request of each target's worker on each endpoint."""
    counts: dict[str, dict[str, int]] = {}
    redis_server = RedisServer().start()
    try:
        supply = suite.TokenSupply(redis_server.client())
        for target in targets:
            for endpoint in endpoints:
                server = _server(target, redis_server.url).start()
                try:
                    # the floor answers anything: it runs as the baseline does (its tokens, no key)
                    name = "baseline" if target.startswith("floor") else target
                    runner = suite.HttpRunner(
                        suite.Servers(redis_server, {name: server}), supply, fastest_rps=300.0
                    )
                    runner.run(name, endpoint, 1, 2)  # warm-up: imports, connections, script caches
                    total, requests = server.worker_instructions(
                        lambda: runner.run(name, endpoint, 1, seconds).requests  # noqa: B023
                    )
                finally:
                    server.stop()
                counts.setdefault(target, {})[endpoint] = total // max(1, requests)
                print(f"[server_callgrind] {target} {endpoint}: {counts[target][endpoint]}", flush=True)
    finally:
        redis_server.stop()
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.server_callgrind", description=__doc__)
    parser.add_argument("--targets", default=",".join(DEFAULT_TARGETS), help=f"of {', '.join(TARGETS)}")
    parser.add_argument("--endpoints", default="generate,consume")
    parser.add_argument("--seconds", type=float, default=10.0, help="wrk's run, under valgrind (default 10)")
    parser.add_argument("--label", help="keep the figures in server_callgrind.json under this label")
    args = parser.parse_args(argv)
    targets = args.targets.split(",")
    unknown = set(targets) - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
    counts = measure(targets, args.endpoints.split(","), args.seconds)
    print(json.dumps(counts, indent=2))
    if args.label:
        kept: dict[str, Any] = json.loads(OUT.read_text()) if OUT.exists() else {"runs": {}}
        kept["runs"][args.label] = {"seconds": args.seconds, **counts}
        OUT.write_text(json.dumps(kept, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
