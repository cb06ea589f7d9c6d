"""``@idempotent`` vs AWS Powertools' ``idempotent_function`` (Redis persistence), on one redis-server.

    python -m benchmarks.functions [--rounds 12] [--calls 300] [--out benchmarks]

Both decorate the same small function, keyed by an order id, and run
sequentially in this process against the same private redis-server:

- **first execution**: ``--calls`` new keys, each called once (claim, run, store);
- **replay**: the same keys called again (the stored result comes back, the
  function does not run).

Every round runs both contenders on fresh keys, alternating which goes first
(A B, B A, ...). The figure per phase is the median over rounds of the ratio
``ours / powertools`` of the two median latencies measured in that round
(< 1: ours is faster). Powertools runs with its local cache off (a second
process would not see it) and without payload validation, ours without a
fingerprint: each does what it needs to run a function at most once.

Writes ``functions.json`` to ``--out`` and replaces this benchmark's own
section of ``RESULTS.md`` there (``--no-results`` to leave it alone). Needs
``aws-lambda-powertools`` (``pip install aws-lambda-powertools``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.procs import RedisServer
from token_service.client import TokenClient, idempotent

# the report keeps sections so marked when the suite rewrites RESULTS.md (benchmarks/report.py)
SECTION_START = "<!-- section: functions -->"
SECTION_END = "<!-- end of section -->"
Call = Callable[[str], Any]


def _ours(url: str, renew: bool = True) -> tuple[Call, Callable[[], None]]:
    client = TokenClient.from_redis(url)

    @idempotent(client, "bench.order", key="order_id", renew=renew)
    def process(order_id: str) -> dict[str, Any]:
        return {"order": order_id, "status": "shipped"}

    return process, client.close


class _LambdaContext:
    """What Powertools reads from a Lambda context: the time left, for its in-progress expiry."""

    def get_remaining_time_in_millis(self) -> int:
        return 300_000


def _powertools(url: str) -> tuple[Call, Callable[[], None]]:
    import redis
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.cache import CachePersistenceLayer

    client = redis.Redis.from_url(url)
    with warnings.catch_warnings():
        # 3.x's CachePersistenceLayer still announces the rename of the class it replaces
        warnings.simplefilter("ignore", DeprecationWarning)
        persistence = CachePersistenceLayer(client=client)  # type: ignore[arg-type]  # its own Protocol
    config = IdempotencyConfig(event_key_jmespath="order_id", use_local_cache=False)
    config.register_lambda_context(_LambdaContext())  # type: ignore[arg-type]

    @idempotent_function(  # type: ignore[untyped-decorator]
        data_keyword_argument="order", persistence_store=persistence, config=config
    )
    def process(order: dict[str, str]) -> dict[str, Any]:
        return {"order": order["order_id"], "status": "shipped"}

    def call(order_id: str) -> Any:
        return process(order={"order_id": order_id})

    return call, client.close


def _median_us(call: Call, keys: list[str]) -> float:
    samples = []
    for key in keys:
        started = time.perf_counter()
        call(key)
        samples.append((time.perf_counter() - started) * 1e6)
    return statistics.median(samples)


def run(rounds: int, calls: int) -> dict[str, Any]:
    load_at_start = os.getloadavg()[0]
    server = RedisServer().start()
    contenders: dict[str, tuple[Call, Callable[[], None]]] = {}
    try:
        contenders["ours"] = _ours(server.url)
        contenders["ours_no_renewal"] = _ours(server.url, renew=False)
        contenders["powertools"] = _powertools(server.url)
        for call, _ in contenders.values():  # warm up: connections, script loading, imports
            for i in range(20):
                call(f"warm-{i}")
                call(f"warm-{i}")
        per_round: list[dict[str, dict[str, float]]] = []
        names = list(contenders)
        for number in range(rounds):
            shift = number % len(names)
            order = names[shift:] + names[:shift]  # each goes first, second, third in turn
            measured: dict[str, dict[str, float]] = {}
            for name in order:
                call, _ = contenders[name]
                keys = [f"r{number}-{name}-{i}" for i in range(calls)]
                measured[name] = {"first_us": _median_us(call, keys), "replay_us": _median_us(call, keys)}
            per_round.append(measured)
        phases: dict[str, Any] = {}
        for phase in ("first_us", "replay_us"):
            summary: dict[str, Any] = {
                f"{name}_us": statistics.median(r[name][phase] for r in per_round) for name in names
            }
            for name in ("ours", "ours_no_renewal"):
                ratios = [r[name][phase] / r["powertools"][phase] for r in per_round]
                summary[f"{name}_ratio"] = statistics.median(ratios)
                summary[f"{name}_ratio_range"] = [min(ratios), max(ratios)]
            phases[phase.removesuffix("_us")] = summary
        return {
            "load_average_at_start": load_at_start,
            "load_average": os.getloadavg()[0],
            "cpus": os.cpu_count(),
            "rounds": rounds,
            "calls": calls,
            "phases": phases,
            "versions": {
                "python": platform.python_version(),
                "redis-server": server.client().info("server")["redis_version"],
                "redis-py": metadata.version("redis"),
                "aws-lambda-powertools": metadata.version("aws-lambda-powertools"),
            },
        }
    finally:
        for _, close in contenders.values():
            close()
        server.stop()


def section(result: dict[str, Any]) -> str:
    versions = ", ".join(f"{name} {version}" for name, version in result["versions"].items())
    rows = []
    for label, phase in (("first execution", "first"), ("replay", "replay")):
        p = result["phases"][phase]
        ratios = [
            f"{p[f'{name}_ratio']:.2f}x ({p[f'{name}_ratio_range'][0]:.2f}-{p[f'{name}_ratio_range'][1]:.2f})"
            for name in ("ours", "ours_no_renewal")
        ]
        rows.append(
            f"| {label} | {p['ours_us']:.0f} | {p['ours_no_renewal_us']:.0f} | {p['powertools_us']:.0f} | "
            f"{ratios[0]} | {ratios[1]} |"
        )
    return "\n".join(
        [
            SECTION_START,
            "## Any function: `@idempotent` vs Powertools' `idempotent_function`",
            "",
            "`python -m benchmarks.functions`: the same small function keyed by an order id, each",
            "decorator on one private redis-server, sequential calls in one process;",
            f"{result['rounds']} rounds of {result['calls']} keys, the contenders' order rotated each round.",
            "Median latency per call (µs). A ratio is the median over rounds of",
            "`ours / Powertools` (below 1: ours is faster), with the range across rounds.",
            "`@idempotent` renews its lease in the background while the function runs (the default:",
            "a renewer scheduled per call, which gets a thread only once a renewal is due);",
            "`renew=False` leaves that out, as Powertools does (its in-progress record simply expires).",
            "",
            "| phase | ours (µs) | ours, renew=False (µs) | Powertools (µs) | ratio | ratio, renew=False |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            f"Versions: {versions}. Load average {result.get('load_average_at_start', float('nan')):.1f} "
            f"at the start, {result['load_average']:.1f} at the end, on {result['cpus']} CPUs (a shared "
            "machine: read the ratios, not the microseconds).",
            SECTION_END,
        ]
    )


def write_results(path: Path, text: str) -> None:
    """Replace this benchmark's section of RESULTS.md (or append it); other sections are untouched."""
    current = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n"
    if SECTION_START in current and SECTION_END in current:
        before, rest = current.split(SECTION_START, 1)
        after = rest.split(SECTION_END, 1)[1]
        updated = before + text + after
    else:
        updated = current.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(updated, encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--no-results", action="store_true", help="do not touch RESULTS.md")
    args = parser.parse_args(argv)
    result = run(args.rounds, args.calls)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "functions.json").write_text(json.dumps(result, indent=2) + "\n")
    text = section(result)
    if not args.no_results:
        write_results(args.out / "RESULTS.md", text)
    print(text)


if __name__ == "__main__":
    main()
