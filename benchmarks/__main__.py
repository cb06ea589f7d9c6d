"""``python -m benchmarks [--quick] [--out DIR]``: run the suite, write RESULTS.md and the plot.

The full run (about 12 minutes) writes ``benchmarks/RESULTS.md``,
``benchmarks/results.json`` and ``benchmarks/results.png``. ``--quick`` runs
every part for a second or so and writes to a temporary directory (or
``--out``): it proves the harness works end to end, and its figures mean
nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import report, suite
from benchmarks.procs import GUNICORN_FLAGS

BENCH_DIR = Path(__file__).resolve().parent


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(config: suite.Config) -> dict[str, Any]:
    started = time.monotonic()
    results: dict[str, Any] = {
        "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m benchmarks" + (" --quick" if config.quick else ""),
        "config": dataclasses.asdict(config),
        "machine": report.machine(),
        "versions": report.versions(),
        "gunicorn": " ".join(GUNICORN_FLAGS),
    }
    with suite.servers(config) as servers:
        client = servers.redis.client()
        runner = suite.HttpRunner(servers, suite.TokenSupply(client))
        if not config.quick:
            log("warm-up")
            for endpoint in ("generate", "consume"):
                for target in servers.by_name:
                    runner.run(target, endpoint, config.peak_connections, 1)
        results["peak"] = {}
        for endpoint in ("generate", "consume"):
            log(f"{endpoint}: service, baselines and worker classes, {config.rounds} rounds")
            results["peak"][endpoint] = suite.compare_peak(runner, config, endpoint)
            log(f"  ratio {results['peak'][endpoint]['ratio']:.2f}")
        log(f"concurrency curve {config.concurrencies}")
        results["curve"] = suite.concurrency_curve(runner, config)
        log("generate at half of peak")
        results["half_peak"] = suite.half_peak_latency(
            runner, config, results["peak"]["generate"]["service"]["rps"]
        )
        if "granian" in servers.by_name:
            log("generate at half of peak, granian")
            results["half_peak_granian"] = suite.half_peak_latency(
                runner, config, results["peak"]["generate"]["granian"]["rps"], "granian", "fastapi"
            )
        log("batch of 1000")
        results["batch"] = suite.batch_throughput(runner, config)
        log("direct transport")
        results["direct"] = suite.direct_transport(servers, config)
        log("application CPU per request, in process")
        results["app_cpu"] = suite.app_cpu(config)
        log("memory per token")
        results["memory"] = suite.memory_per_token(servers, config)
        log("redis-benchmark")
        results["redis"] = suite.redis_ceiling(servers, config)
        client.close()
    results["load_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    results["failed_requests"] = sum(int(r["errors"]) for r in runner.results)
    results["elapsed_seconds"] = time.monotonic() - started
    results["budgets"] = report.budgets(results)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a few seconds: check the harness only")
    parser.add_argument("--out", type=Path, default=None, help="where to write RESULTS.md and the plot")
    parser.add_argument("--rounds", type=int, default=None, help="A B rounds per comparison (default 5)")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per measured run (default 5)")
    args = parser.parse_args(argv)
    config = suite.Config.quick_mode() if args.quick else suite.Config()
    if args.rounds:
        config.rounds = args.rounds
    if args.seconds:
        config.seconds = args.seconds
    out_dir = args.out or (Path(tempfile.mkdtemp(prefix="ts-bench-")) if args.quick else BENCH_DIR)
    results = run(config)
    results["command"] = " ".join(["python -m benchmarks", *(shlex.quote(a) for a in (argv or sys.argv[1:]))])
    path = report.write(results, out_dir)
    for budget in results["budgets"]:
        state = "met" if budget["met"] else "NOT MET"
        print(f"{budget['budget']}: {budget['value']} ({budget['ratio']}; target {budget['target']}) {state}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
