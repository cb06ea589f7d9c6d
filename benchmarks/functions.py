"""``@idempotent`` and the token guard vs AWS Powertools' ``idempotent_function``, on one redis-server.

    python -m benchmarks.functions [--rounds 12] [--calls 300] [--out benchmarks]
    python -m benchmarks.functions --callgrind LABEL [--calls 500]  # instructions per call

``@idempotent`` and Powertools decorate the same small function, keyed by an
order id; the token guard (``client.guard(token, scope).run(function, ...)``)
runs it under tokens issued beforehand (outside the timing). All run
sequentially in this process against the same private redis-server:

- **first execution**: ``--calls`` new keys, each called once (claim, run, store);
- **replay**: the same keys called again (the stored result comes back, the
  function does not run).

Every round runs every contender on fresh keys, rotating which goes first.
The figure per phase is the median over rounds of the ratio ``ours /
powertools`` of the two median latencies measured in that round (< 1: ours is
faster); for the guard, of the two throughputs (calls per second over the
phase, > 1: the guard is faster). The budgets (issue 24) are checked on those
ratios, all from one run.

``--callgrind`` counts instructions instead of time (load-independent): it
runs each contender's phase under ``valgrind --tool=callgrind`` twice (N and
2N calls, plus the startup both share) and reports the difference per call.

Powertools runs with its local cache off (a second process would not see
it) and without payload validation, ours without a fingerprint: each does
what it needs to run a function at most once.

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
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.procs import REPO_ROOT, RedisServer, require
from token_service.client import TokenClient, idempotent

# the report keeps sections so marked when the suite rewrites RESULTS.md (benchmarks/report.py)
SECTION_START = "<!-- section: functions -->"
SECTION_END = "<!-- end of section -->"
Call = Callable[[str], Any]
SCOPE = "bench.order"
# issue 24: ratios in one run, renewal on
BUDGETS = {
    "idempotent_first_latency": 0.8,  # @idempotent / Powertools, at most
    "idempotent_replay_latency": 0.35,  # at most
    "guard_first_throughput": 1.2,  # guard / Powertools, at least
    "guard_replay_throughput": 4.0,  # at least
    # issue 32: redis-server's CPU per keyed first execution, @idempotent / Powertools, at most
    "idempotent_first_redis_cpu": 1.25,
}


def _cpu_seconds(pid: int) -> float:
    """A process's user + system CPU so far (/proc/<pid>/stat), network work included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _commandstats(client: Any) -> dict[str, tuple[int, float]]:
    """Calls and µs per call of each command since the last CONFIG RESETSTAT."""
    return {
        name.removeprefix("cmdstat_"): (int(stat["calls"]), float(stat["usec_per_call"]))
        for name, stat in client.info("commandstats").items()
        if not name.startswith(("cmdstat_config", "cmdstat_info"))
    }


def _shipped(order_id: str) -> dict[str, Any]:
    return {"order": order_id, "status": "shipped"}


def _ours(url: str, renew: bool = True) -> tuple[Call, Callable[[], None]]:
    client = TokenClient.from_redis(url)

    @idempotent(client, SCOPE, key="order_id", renew=renew)
    def process(order_id: str) -> dict[str, Any]:
        return {"order": order_id, "status": "shipped"}

    return process, client.close


class _Guard:
    """``client.guard(token, scope).run(...)``: called with a token issued by :meth:`tokens`."""

    def __init__(self, url: str) -> None:
        self.client = TokenClient.from_redis(url)

    def tokens(self, count: int) -> list[str]:
        issued: list[str] = []
        while len(issued) < count:
            batch = self.client.generate_batch(SCOPE, min(1000, count - len(issued)))
            issued += [each.token for each in batch]
        return issued

    def __call__(self, token: str) -> Any:
        return self.client.guard(token, SCOPE).run(_shipped, "o-1")


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


def _measure(call: Call, keys: list[str]) -> tuple[float, float]:
    """(median latency in µs, throughput in calls per second over the whole phase)."""
    samples = []
    began = time.perf_counter()
    for key in keys:
        started = time.perf_counter()
        call(key)
        samples.append((time.perf_counter() - started) * 1e6)
    return statistics.median(samples), len(keys) / (time.perf_counter() - began)


def _keys(name: str, number: int, calls: int, guard: _Guard) -> list[str]:
    if name == "guard":
        return guard.tokens(calls)
    return [f"r{number}-{name}-{i}" for i in range(calls)]


def run(rounds: int, calls: int) -> dict[str, Any]:
    load_at_start = os.getloadavg()[0]
    server = RedisServer().start()
    contenders: dict[str, tuple[Call, Callable[[], None]]] = {}
    try:
        contenders["ours"] = _ours(server.url)
        contenders["ours_no_renewal"] = _ours(server.url, renew=False)
        guard = _Guard(server.url)
        contenders["guard"] = (guard, guard.client.close)
        contenders["powertools"] = _powertools(server.url)
        for name, (call, _) in contenders.items():  # warm up: connections, script loading, imports
            for key in _keys(name, -1, 20, guard):
                call(key)
                call(key)
        per_round: list[dict[str, dict[str, float]]] = []
        names = list(contenders)
        admin = server.client()
        redis_pid = server.pids()[0]
        stats: dict[str, dict[str, dict[str, tuple[int, float]]]] = {}  # the last round's
        for number in range(rounds):
            shift = number % len(names)
            order = names[shift:] + names[:shift]  # each goes first, second, third... in turn
            measured: dict[str, dict[str, float]] = {}
            for name in order:
                call, _ = contenders[name]
                keys = _keys(name, number, calls, guard)
                admin.config_resetstat()
                cpu_before = _cpu_seconds(redis_pid)
                first_us, first_per_s = _measure(call, keys)
                first_cpu_us = (_cpu_seconds(redis_pid) - cpu_before) / calls * 1e6
                stats.setdefault(name, {})["first"] = _commandstats(admin)
                admin.config_resetstat()
                cpu_before = _cpu_seconds(redis_pid)
                replay_us, replay_per_s = _measure(call, keys)
                replay_cpu_us = (_cpu_seconds(redis_pid) - cpu_before) / calls * 1e6
                stats[name]["replay"] = _commandstats(admin)
                measured[name] = {
                    "first_us": first_us,
                    "replay_us": replay_us,
                    "first_per_s": first_per_s,
                    "replay_per_s": replay_per_s,
                    "first_redis_cpu_us": first_cpu_us,
                    "replay_redis_cpu_us": replay_cpu_us,
                }
            per_round.append(measured)
        phases: dict[str, Any] = {}
        for phase in ("first", "replay"):
            summary: dict[str, Any] = {}
            for name in names:
                summary[f"{name}_us"] = statistics.median(r[name][f"{phase}_us"] for r in per_round)
                summary[f"{name}_per_s"] = statistics.median(r[name][f"{phase}_per_s"] for r in per_round)
            for name in ("ours", "ours_no_renewal"):  # latency: below 1 is faster
                ratios = [r[name][f"{phase}_us"] / r["powertools"][f"{phase}_us"] for r in per_round]
                summary[f"{name}_ratio"] = statistics.median(ratios)
                summary[f"{name}_ratio_range"] = [min(ratios), max(ratios)]
            for name in names:
                summary[f"{name}_redis_cpu_us"] = statistics.median(
                    r[name][f"{phase}_redis_cpu_us"] for r in per_round
                )
            # Redis CPU over the phase (the clock tick is 10 ms: enough calls per round make it fine)
            ratios = [
                r["ours"][f"{phase}_redis_cpu_us"] / max(r["powertools"][f"{phase}_redis_cpu_us"], 1e-9)
                for r in per_round
            ]
            summary["ours_redis_cpu_ratio"] = statistics.median(ratios)
            summary["ours_redis_cpu_ratio_range"] = [min(ratios), max(ratios)]
            # throughput: above 1 is faster
            ratios = [r["guard"][f"{phase}_per_s"] / r["powertools"][f"{phase}_per_s"] for r in per_round]
            summary["guard_throughput_ratio"] = statistics.median(ratios)
            summary["guard_throughput_ratio_range"] = [min(ratios), max(ratios)]
            phases[phase] = summary
        return {
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_average_at_start": load_at_start,
            "load_average": os.getloadavg()[0],
            "cpus": os.cpu_count(),
            "rounds": rounds,
            "calls": calls,
            "phases": phases,
            "commandstats": stats,
            "budgets": budgets(phases),
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


def budgets(phases: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [
        (
            "`@idempotent` first execution, latency vs Powertools",
            "first",
            "ours_ratio",
            "<=",
            BUDGETS["idempotent_first_latency"],
        ),
        (
            "`@idempotent` replay, latency vs Powertools",
            "replay",
            "ours_ratio",
            "<=",
            BUDGETS["idempotent_replay_latency"],
        ),
        (
            "`@idempotent` first execution, redis-server CPU vs Powertools",
            "first",
            "ours_redis_cpu_ratio",
            "<=",
            BUDGETS["idempotent_first_redis_cpu"],
        ),
        (
            "token guard first execution, throughput vs Powertools",
            "first",
            "guard_throughput_ratio",
            ">=",
            BUDGETS["guard_first_throughput"],
        ),
        (
            "token guard replay, throughput vs Powertools",
            "replay",
            "guard_throughput_ratio",
            ">=",
            BUDGETS["guard_replay_throughput"],
        ),
    ]
    checked = []
    for label, phase, key, sense, target in rows:
        measured = phases[phase][key]
        met = measured <= target if sense == "<=" else measured >= target
        checked.append({"budget": label, "measured": measured, "target": f"{sense} {target}x", "met": met})
    return checked


def section(result: dict[str, Any], instructions: dict[str, Any] | None = None) -> str:
    versions = ", ".join(f"{name} {version}" for name, version in result["versions"].items())
    rows = []
    for label, phase in (("first execution", "first"), ("replay", "replay")):
        p = result["phases"][phase]
        ratios = [
            f"{p[f'{name}_ratio']:.2f}x ({p[f'{name}_ratio_range'][0]:.2f}-{p[f'{name}_ratio_range'][1]:.2f})"
            for name in ("ours", "ours_no_renewal")
        ]
        low, high = p["guard_throughput_ratio_range"]
        rows.append(
            f"| {label} | {p['ours_us']:.0f} | {p['ours_no_renewal_us']:.0f} | {p['guard_us']:.0f} | "
            f"{p['powertools_us']:.0f} | {ratios[0]} | {ratios[1]} | "
            f"{p['guard_per_s']:.0f} / {p['powertools_per_s']:.0f} = "
            f"{p['guard_throughput_ratio']:.2f}x ({low:.2f}-{high:.2f}) |"
        )
    budget_rows = [
        f"| {b['budget']} | {b['measured']:.2f}x | {b['target']} | {'yes' if b['met'] else '**NO**'} |"
        for b in result["budgets"]
    ]
    cpu_rows = []
    for label, phase in (("first execution", "first"), ("replay", "replay")):
        p = result["phases"][phase]
        low, high = p["ours_redis_cpu_ratio_range"]
        cpu_rows.append(
            f"| {label} | {p['ours_redis_cpu_us']:.1f} | {p['guard_redis_cpu_us']:.1f} | "
            f"{p['powertools_redis_cpu_us']:.1f} | {p['ours_redis_cpu_ratio']:.2f}x ({low:.2f}-{high:.2f}) |"
        )
    stat_rows = [
        f"| {name}, {phase} | "
        + ", ".join(
            f"{command} {calls / result['calls']:.0f}x {usec:.2f} µs"
            for command, (calls, usec) in found.items()
        )
        + " |"
        for name, phases in result.get("commandstats", {}).items()
        for phase, found in phases.items()
    ]
    lines = [
        SECTION_START,
        "## Any function: `@idempotent` and the token guard vs Powertools' `idempotent_function`",
        "",
        "`python -m benchmarks.functions`: the same small function keyed by an order id, each",
        "decorator on one private redis-server, sequential calls in one process; the token guard",
        "(`client.guard(token, scope).run(...)`) runs it under tokens issued beforehand (untimed).",
        f"Run {result.get('when', '?')}: {result['rounds']} rounds of {result['calls']} keys, the",
        "contenders' order rotated each round. Median latency per call (µs). A latency ratio is the",
        "median over rounds of `ours / Powertools` (below 1: ours is faster), with the range across",
        "rounds; the guard's is a throughput ratio (calls/s over the phase, `guard / Powertools`,",
        "above 1: the guard is faster). `@idempotent` and the guard renew their lease in the",
        "background while the function runs (the default: a heap entry on the process's renewal",
        "scheduler, taken off when the call ends); `renew=False` leaves that out, as Powertools does",
        "(its in-progress record simply expires).",
        "",
        "| phase | `@idempotent` (µs) | renew=False (µs) | guard (µs) | Powertools (µs) | "
        "`@idempotent` ratio | renew=False ratio | guard/Powertools calls/s |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "redis-server's CPU (user + system, from /proc, network work included) per call over each",
        "phase, median over rounds (µs), and `@idempotent / Powertools` paired per round (range):",
        "",
        "| phase | `@idempotent` | guard | Powertools | `@idempotent` / Powertools |",
        "|---|---|---|---|---|",
        *cpu_rows,
        "",
        "`INFO commandstats` of the last round, per call of the contender (commands per call, µs",
        "per command; a script's µs include the commands it runs):",
        "",
        "| contender, phase | commands |",
        "|---|---|",
        *stat_rows,
        "",
        "Budgets (issues 24 and 32), from this run:",
        "",
        "| budget | measured | target | met |",
        "|---|---|---|---|",
        *budget_rows,
        "",
        f"Versions: {versions}. Load average {result.get('load_average_at_start', float('nan')):.1f} "
        f"at the start, {result['load_average']:.1f} at the end, on {result['cpus']} CPUs (a shared "
        "machine: read the ratios, not the microseconds).",
    ]
    if instructions:
        lines += ["", *_instruction_lines(instructions)]
    lines.append(SECTION_END)
    return "\n".join(lines)


def _instruction_lines(instructions: dict[str, Any]) -> list[str]:
    """The callgrind table: client instructions per call (this process only, not redis-server)."""
    runs = instructions["runs"]
    labels = list(runs)
    header = "| contender, phase | " + " | ".join(labels) + " |"
    rows = []
    for contender in ("ours", "guard", "powertools"):
        for phase in ("first", "replay"):
            cells = []
            for label in labels:
                value = runs[label].get(contender, {}).get(phase)
                cells.append(f"{value / 1000:.0f} k" if value else "-")
            rows.append(f"| {contender}, {phase} | " + " | ".join(cells) + " |")
    return [
        "Instructions per call in the calling process (`python -m benchmarks.functions --callgrind`:",
        "`valgrind --tool=callgrind` on N and 2N calls against a real redis-server, the",
        "difference per call: load-independent; redis-server's own work is not counted).",
        "",
        header,
        "|---|" + "---|" * len(labels),
        *rows,
        *(["", *instructions["notes"]] if instructions.get("notes") else []),
    ]


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


def drive(name: str, phases: str, calls: int, url: str) -> None:
    """Run one contender's calls (what --callgrind measures): ``phases`` is first or both."""
    guard = _Guard(url)
    contenders: dict[str, Call] = {"guard": guard, "powertools": _powertools(url)[0]}
    contenders["ours"] = _ours(url)[0]
    call = contenders[name]
    for key in _keys(name, -1, 20, guard):  # warm up
        call(key)
        call(key)
    keys = _keys(name, 0, calls, guard)
    for key in keys:
        call(key)
    if phases == "both":
        for key in keys:
            call(key)


def callgrind(calls: int) -> dict[str, dict[str, int]]:
    """Instructions per call: (first 2N - first N) / N, and (both 2N - first 2N) / 2N."""
    valgrind = require("valgrind", "apt-get install valgrind")
    server = RedisServer().start()
    try:

        def total(name: str, phases: str, count: int) -> int:
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "callgrind.out"
                command = [valgrind, "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable]
                command += ["-m", "benchmarks.functions", "--drive", name, phases, str(count), server.url]
                subprocess.run(command, check=True, capture_output=True, cwd=REPO_ROOT)
                for line in out.read_text().splitlines():
                    if line.startswith("totals:"):
                        return int(line.split()[1])
            raise RuntimeError("callgrind wrote no totals")

        counts: dict[str, dict[str, int]] = {}
        for name in ("ours", "guard", "powertools"):
            first_n = total(name, "first", calls)
            first_2n = total(name, "first", 2 * calls)
            both_2n = total(name, "both", 2 * calls)
            counts[name] = {
                "first": (first_2n - first_n) // calls,
                "replay": (both_2n - first_2n) // (2 * calls),
            }
        return counts
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--no-results", action="store_true", help="do not touch RESULTS.md")
    parser.add_argument("--callgrind", metavar="LABEL", help="count instructions; record them under LABEL")
    parser.add_argument(
        "--drive", nargs=4, metavar=("NAME", "PHASES", "CALLS", "URL"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.drive:
        name, phases, calls, url = args.drive
        drive(name, phases, int(calls), url)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    instructions_path = args.out / "functions_callgrind.json"
    instructions = json.loads(instructions_path.read_text()) if instructions_path.exists() else None
    if args.callgrind:
        instructions = instructions or {"runs": {}}
        instructions["runs"][args.callgrind] = callgrind(args.calls)
        instructions_path.write_text(json.dumps(instructions, indent=2) + "\n")
        print(json.dumps(instructions["runs"][args.callgrind], indent=2))
        return
    result = run(args.rounds, args.calls)
    (args.out / "functions.json").write_text(json.dumps(result, indent=2) + "\n")
    text = section(result, instructions)
    if not args.no_results:
        write_results(args.out / "RESULTS.md", text)
    print(text)


if __name__ == "__main__":
    main()
