"""Instructions per request of each hot route, in process: ``python -m benchmarks.routes_callgrind``.

Throughput on this shared machine moves with its load; instruction counts do
not. This runs one Python process under ``valgrind --tool=callgrind`` that
builds the service's WSGI app as a gunicorn worker has it (``create_app()``
with the benchmark's settings, Prometheus in multiprocess mode, JSON access
lines written to /dev/null) and the hand-written baseline's, and calls each
with the bodies wrk sends, against a real private redis-server. Callgrind
dumps its counters at every call of ``getppid`` (``--dump-before``), which the
driver makes between phases, so each phase -- N requests of one route of one
app, environs and tokens made beforehand -- is one dump, and its total over N
is the instructions per request in the worker's own process (redis-server's
work is not counted, nor is the server's: gunicorn's parsing and writing).

``--label NAME`` keeps the figures in ``routes_callgrind.json`` under NAME, so a
change is measured before and after on the same machine; the file holds
every label kept.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from benchmarks.procs import REPO_ROOT, RedisServer, require

__all__ = ["PHASES", "callgrind", "drive", "main"]

# (app, route): what one dump measures, in the order the driver runs them.
PHASES = (
    ("service", "generate"),
    ("service", "consume"),
    ("baseline", "generate"),
    ("baseline", "consume"),
)
OUT = Path(__file__).resolve().parent / "routes_callgrind.json"


def _mark() -> None:
    # callgrind dumps its counters before each getppid (--dump-before): one dump per phase
    os.getppid()


def drive(url: str, requests: int) -> None:
    """The measured process: warm both apps up, then each phase of :data:`PHASES` between marks."""
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="ts-bench-metrics-"))
    import logging.config

    import redis

    from benchmarks import app_cpu, baseline_app, suite
    from token_service import create_app
    from token_service.server.logs import logging_config

    logging.config.dictConfig(logging_config("INFO"))
    devnull = open(os.devnull, "w")  # noqa: SIM115 (the process's whole life)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(devnull)
    os.environ["BENCH_REDIS_URL"] = url
    apps: dict[str, Callable[..., Iterable[bytes]]] = {
        "service": create_app({**suite.SERVICE_ENV, "redis_url": url}),
        "baseline": baseline_app.create_app(),
    }
    supply = suite.TokenSupply(redis.Redis.from_url(url))

    def environs(app: str, route: str, count: int) -> list[app_cpu.Environ]:
        if route == "generate":
            body = [{"scope": suite.SCOPE, "subject": f"user-{i}"} for i in range(count)]
            return [app_cpu.environ("/token/generate", b, None) for b in body]
        if app == "service":
            tokens, key = supply.service_tokens(count), suite.API_KEY
        else:
            tokens, key = supply.baseline_tokens(count), None
        return [app_cpu.environ("/token/consume", {"token": t, "scope": suite.SCOPE}, key) for t in tokens]

    for app, route in PHASES:  # warm-up: connections, script caches, labelled children
        app_cpu.serve(apps[app], environs(app, route, 50), "201" if route == "generate" else "200")
    batches = {(app, route): environs(app, route, requests) for app, route in PHASES}
    for app, route in PHASES:
        _mark()
        app_cpu.serve(apps[app], batches[app, route], "201" if route == "generate" else "200")
    _mark()


def callgrind(requests: int, keep: Path | None = None) -> dict[str, dict[str, int]]:
    """Instructions per request of each phase: its dump's total over ``requests``; ``keep``: a
    directory to copy the dumps to (``callgrind_annotate`` reads them)."""
    valgrind = require("valgrind", "apt-get install valgrind")
    server = RedisServer().start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "callgrind.out"
            command = [valgrind, "--tool=callgrind", "--dump-before=getppid", f"--callgrind-out-file={out}"]
            command += [sys.executable, "-m", "benchmarks.routes_callgrind", "--drive", server.url]
            command += [str(requests)]
            # one hash seed: set and dict iteration orders (and so the counts) are the same every run
            env = {**os.environ, "PYTHONHASHSEED": "0"}
            done = subprocess.run(
                command, capture_output=True, text=True, cwd=REPO_ROOT, env=env, check=False
            )
            if done.returncode != 0:
                raise RuntimeError(f"the driver failed under callgrind:\n{done.stderr[-3000:]}")
            # dump k (k >= 1) is written before the k-th mark: dump 1 is the start-up and warm-up,
            # dump 2 the first phase, ...
            totals = [_total(Path(f"{out}.{k}")) for k in range(2, len(PHASES) + 2)]
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                for k, (app, route) in enumerate(PHASES, start=2):
                    shutil.copy(f"{out}.{k}", keep / f"callgrind.{app}-{route}")
    finally:
        server.stop()
    counts: dict[str, dict[str, int]] = {}
    for (app, route), total in zip(PHASES, totals, strict=True):
        counts.setdefault(app, {})[route] = total // requests
    return counts


def _total(dump: Path) -> int:
    for line in dump.read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"{dump} has no totals")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.routes_callgrind", description=__doc__)
    parser.add_argument("--requests", type=int, default=300, help="requests per phase (default 300)")
    parser.add_argument("--label", help="keep the figures in routes_callgrind.json under this label")
    parser.add_argument("--keep", type=Path, help="copy each phase's callgrind dump to this directory")
    parser.add_argument("--drive", nargs=2, metavar=("URL", "REQUESTS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.drive:
        drive(args.drive[0], int(args.drive[1]))
        return 0
    counts = callgrind(args.requests, args.keep)
    print(json.dumps(counts, indent=2))
    if args.label:
        kept: dict[str, Any] = json.loads(OUT.read_text()) if OUT.exists() else {"runs": {}}
        kept["runs"][args.label] = {"requests": args.requests, **counts}
        OUT.write_text(json.dumps(kept, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
