"""Issue 35's two HTTP budgets on their own: ``python -m benchmarks.http_budgets [--rounds N] [--write]``.

The suite (``python -m benchmarks``, ~15 minutes) measures everything; this
measures only what the two budgets compare, in about ``rounds`` x 45 s:

- on gunicorn (the default, ``service``: the shipped config, gevent workers),
  generate and consume against the hand-written Flask baseline on sync
  workers (``baseline-sync``): >= 1.5x;
- on granian (``token-service serve --server granian``), the same against the
  FastAPI + uvicorn twin (``fastapi``): >= 1.0x (stretch 1.2x), and generate's
  p99 at half of granian's peak <= 5 ms.

The four servers run in every round, in an order rotated every round and
reversed every other one (``suite.compare_peak``); a ratio is the median of the
pairs measured in the same round, and its range over the rounds is printed
beside it. ``--write`` keeps the table in RESULTS.md's ``http budgets``
section (a run of the suite keeps it).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import report, suite

__all__ = ["BUDGETS", "main", "measure", "section"]

TARGETS = ("service", "baseline-sync", "fastapi", "granian")
# (pair, what it is, target ratio, stretch)
BUDGETS = (
    ("service / baseline-sync", "gunicorn (gevent) vs hand-written Flask on sync workers", 1.5, None),
    ("granian / fastapi", "granian vs FastAPI + uvicorn", 1.0, 1.2),
)
SECTION = "http budgets"
OUT = Path(__file__).resolve().parent


def measure(config: suite.Config) -> dict[str, Any]:
    started = time.monotonic()
    results: dict[str, Any] = {
        "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_at_start": os.getloadavg()[0],
        "rounds": config.rounds,
        "seconds": config.seconds,
        "connections": config.peak_connections,
        "workers": config.workers,
        "commit": report.versions()["token-service commit"],
    }
    with suite.servers(config, TARGETS) as servers:
        runner = suite.HttpRunner(servers, suite.TokenSupply(servers.redis.client()))
        for endpoint in ("generate", "consume"):  # warm-up: connections, script caches
            for target in TARGETS:
                runner.run(target, endpoint, config.peak_connections, 1)
        results["peak"] = {
            endpoint: suite.compare_peak(runner, config, endpoint, TARGETS)
            for endpoint in ("generate", "consume")
        }
        peak = results["peak"]["generate"]
        results["half_peak"] = {
            "service": suite.half_peak_latency(
                runner, config, peak["service"]["rps"], "service", "baseline-sync"
            ),
            "granian": suite.half_peak_latency(runner, config, peak["granian"]["rps"], "granian", "fastapi"),
        }
        results["failed_requests"] = sum(int(r["errors"]) for r in runner.results)
    results["load_at_end"] = os.getloadavg()[0]
    results["elapsed_seconds"] = round(time.monotonic() - started)
    return results


def _range(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def section(results: dict[str, Any]) -> str:
    lines = [
        "## HTTP budgets (issue 35): `python -m benchmarks.http_budgets`",
        "",
        f"{results['started']}, commit {results['commit']}: {results['rounds']} rounds of "
        f"{results['seconds']:g} s at {results['connections']} connections, {results['workers']} workers "
        f"each, the four servers alternated in every round; load average {results['load_at_start']:.1f} "
        f"at the start, {results['load_at_end']:.1f} at the end ({results['failed_requests']} failed "
        "requests). Ratio: the median of the pairs measured in the same round; range: the lowest "
        "and highest round; CPU: the reverse ratio of server CPU per request (what a quiet machine "
        "would show).",
        "",
        "| budget | endpoint | req/s | against | ratio | range | CPU ratio | target | met |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for pair, what, target, stretch in BUDGETS:
        top, bottom = pair.split(" / ")
        for endpoint in ("generate", "consume"):
            peak = results["peak"][endpoint]
            paired = peak["pairs"][pair]
            goal = f">= {target}x" + (f" (stretch {stretch}x)" if stretch else "")
            met = "yes" if paired["ratio"] >= target else "**NO**"
            if stretch and paired["ratio"] >= stretch:
                met = "yes, stretch too"
            lines.append(
                f"| {what} | {endpoint} | {peak[top]['rps']:.0f} | {peak[bottom]['rps']:.0f} | "
                f"{paired['ratio']:.2f}x | {_range(paired['round_ratios'])} | {paired['cpu_ratio']:.2f}x | "
                f"{goal} | {met} |"
            )
    lines += ["", "| server | generate p99 at half of peak | req/s | reference p99 (same pacing) | target |"]
    lines.append("|---|---|---|---|---|")
    for name, half in results["half_peak"].items():
        lines.append(
            f"| {name} | {half['p99_ms']:.2f} ms ({_range(half['all_p99_ms'])}) | {half['rps']:.0f} | "
            f"{half['reference']} {half['baseline']['p99_ms']:.2f} ms | <= 5 ms |"
        )
    lines += ["", "Requests per second in each round (the order rotated):", ""]
    for endpoint in ("generate", "consume"):
        peak = results["peak"][endpoint]
        cells = "; ".join(
            f"{name} {', '.join(f'{v:.0f}' for v in peak[name]['all_rps'])}" for name in TARGETS
        )
        lines.append(f"- {endpoint}: {cells}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.http_budgets", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--write", action="store_true", help="keep the table in RESULTS.md")
    parser.add_argument("--quick", action="store_true", help="one short round: checks the harness only")
    args = parser.parse_args(argv)
    config = (
        suite.Config.quick_mode() if args.quick else suite.Config(rounds=args.rounds, seconds=args.seconds)
    )
    results = measure(config)
    text = section(results)
    print(text)
    if args.write and not args.quick:
        (OUT / "http_budgets.json").write_text(json.dumps(results, indent=2) + "\n")
        path = OUT / "RESULTS.md"
        path.write_text(report.replace_section(path.read_text(), SECTION, text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
