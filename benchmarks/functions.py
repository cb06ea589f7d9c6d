"""``@idempotent`` and the token guard vs AWS Powertools' ``idempotent_function``, on one redis-server.

    python -m benchmarks.functions [--rounds 24] [--calls 400] [--block 25] [--out benchmarks]
    python -m benchmarks.functions --callgrind LABEL [--calls 500]  # client instructions per call
    python -m benchmarks.functions --callgrind-redis LABEL [--calls 300]  # redis-server's

``@idempotent`` and Powertools decorate the same small function, keyed by an
order id; the token guard (``client.guard(token, scope).run(function, ...)``)
runs it under tokens issued beforehand (outside the timing). All run
sequentially in this process against the same private redis-server:

- **first execution**: ``--calls`` new keys, each called once (claim, run, store);
- **replay**: the same keys called again (the stored result comes back, the
  function does not run).

Every round runs every contender on fresh keys, interleaved: they take turns
``--block`` calls at a time, the order rotated every turn, first executions
and then replays, so that a change in the machine's load (a shared machine)
falls on all of them alike. The figure per phase is the median over rounds of
the ratio ``ours / powertools`` taken within the round: of the two median
latencies (< 1: ours is faster), of redis-server's CPU per call (schedstat:
user + system, network work included), and for the guard of the two
throughputs (calls per second of the median turn, > 1: the guard is faster). The
budgets (issues 24 and 32) are checked on those ratios, all from one run, and
reported with the middle half and the range of the rounds.

``--callgrind`` counts instructions instead of time (load-independent): it
runs each contender's phase under ``valgrind --tool=callgrind`` twice (N and
2N calls, plus the startup both share) and reports the difference per call.
``--callgrind-redis`` counts redis-server's instructions per call instead (the
server under callgrind, the contenders in this process): user space only, the
kernel's share of the network work is not in it.

Powertools runs with its local cache off (a second process would not see
it) and without payload validation, ours without a fingerprint: each does
what it needs to run a function at most once.

Writes ``functions.json`` to ``--out`` and replaces this benchmark's own
section of ``RESULTS.md`` there (``--no-results`` to leave it alone). Needs
``aws-lambda-powertools`` (``pip install aws-lambda-powertools``).
"""

from __future__ import annotations

import argparse
import gc
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

from benchmarks.procs import REPO_ROOT, CallgrindRedis, RedisServer, cpu_seconds_precise, require
from token_service.client import TokenClient, idempotent

# the report keeps sections so marked when the suite rewrites RESULTS.md (benchmarks/report.py)
SECTION_START = "<!-- section: functions -->"
SECTION_END = "<!-- end of section -->"
Call = Callable[[str], Any]
SCOPE = "bench.order"
# issues 24 and 32: ratios in one run, renewal on
BUDGETS = {
    "idempotent_first_latency": 0.8,  # @idempotent / Powertools, at most
    "idempotent_replay_latency": 0.35,  # at most
    "guard_first_throughput": 1.5,  # guard / Powertools, at least (issue 24: 1.2)
    "guard_replay_throughput": 5.0,  # at least (issue 24: 4.0)
    # redis-server's CPU per keyed first execution, @idempotent / Powertools, at most
    "idempotent_first_redis_cpu": 1.25,
}


def _redis_cpu_ns(pid: int) -> int:
    """redis-server's CPU so far, every thread, user + system (network work included), in the
    scheduler's nanoseconds (/proc/<pid>/task/*/schedstat): fine enough for a block of calls."""
    return round(cpu_seconds_precise([pid]) * 1e9)


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


def _keys(name: str, number: int, calls: int, guard: _Guard) -> list[str]:
    if name == "guard":
        return guard.tokens(calls)
    return [f"r{number}-{name}-{i}" for i in range(calls)]


def _spread(values: list[float]) -> dict[str, float]:
    """The median of per-round figures, with their range and their middle half."""
    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {
        "median": statistics.median(values),
        "low": min(values),
        "high": max(values),
        "q1": quartiles[0],
        "q3": quartiles[2],
    }


class _Tally:
    """One contender's figures in one phase of one round, added up block by block."""

    def __init__(self) -> None:
        self.samples_us: list[float] = []
        self.turn_rates: list[float] = []  # calls per second of each turn
        self.redis_ns = 0
        self.client_ns = 0

    def run(self, call: Call, keys: list[str], redis_pid: int) -> None:
        perf_counter = time.perf_counter
        samples = self.samples_us
        redis_before = _redis_cpu_ns(redis_pid)
        client_before = time.thread_time_ns()
        began = perf_counter()
        for key in keys:
            started = perf_counter()
            call(key)
            samples.append((perf_counter() - started) * 1e6)
        self.turn_rates.append(len(keys) / (perf_counter() - began))
        self.client_ns += time.thread_time_ns() - client_before
        self.redis_ns += _redis_cpu_ns(redis_pid) - redis_before

    def figures(self, calls: int) -> dict[str, float]:
        """Median latency, throughput, and redis-server's and the caller's CPU per call."""
        return {
            "us": statistics.median(self.samples_us),
            # the median turn's: a turn that lost its core for a time slice is one of 16, not a
            # sixteenth of the phase's time
            "per_s": statistics.median(self.turn_rates),
            "redis_cpu_us": self.redis_ns / calls / 1000,
            "client_cpu_us": self.client_ns / calls / 1000,
        }


def _round(
    contenders: dict[str, Call], keys: dict[str, list[str]], block: int, shift: int, redis_pid: int
) -> dict[str, dict[str, dict[str, float]]]:
    """One round: every contender's first executions, then its replays, interleaved ``block``
    calls at a time (the order rotated every block), so that all of them run under the same
    load; figures per contender and phase."""
    names = list(contenders)
    calls = len(next(iter(keys.values())))
    tallies = {name: {"first": _Tally(), "replay": _Tally()} for name in names}
    gc.collect()  # no collection of an earlier round's garbage lands on one contender
    for phase in ("first", "replay"):
        for number, start in enumerate(range(0, calls, block)):
            turn = (shift + number) % len(names)
            for name in names[turn:] + names[:turn]:
                tallies[name][phase].run(contenders[name], keys[name][start : start + block], redis_pid)
    return {name: {phase: t.figures(calls) for phase, t in each.items()} for name, each in tallies.items()}


def _commandstats_pass(
    admin: Any, contenders: dict[str, Call], calls: int, guard: _Guard
) -> dict[str, dict[str, dict[str, tuple[int, float]]]]:
    """``INFO commandstats`` of each contender alone, first executions then replays (not timed)."""
    stats: dict[str, dict[str, dict[str, tuple[int, float]]]] = {}
    for name, call in contenders.items():
        keys = _keys(name, 10_000, calls, guard)
        for phase in ("first", "replay"):
            admin.config_resetstat()
            for key in keys:
                call(key)
            stats.setdefault(name, {})[phase] = _commandstats(admin)
    return stats


def run(rounds: int, calls: int, block: int = 25) -> dict[str, Any]:
    load_at_start = os.getloadavg()[0]
    server = RedisServer().start()
    contenders: dict[str, tuple[Call, Callable[[], None]]] = {}
    try:
        contenders["ours"] = _ours(server.url)
        contenders["ours_no_renewal"] = _ours(server.url, renew=False)
        guard = _Guard(server.url)
        contenders["guard"] = (guard, guard.client.close)
        contenders["powertools"] = _powertools(server.url)
        calling = {name: call for name, (call, _) in contenders.items()}
        for name, call in calling.items():  # warm up: connections, script loading, imports
            for key in _keys(name, -1, 20, guard):
                call(key)
                call(key)
        names = list(contenders)
        redis_pid = server.pids()[0]
        per_round = []
        for number in range(rounds):
            keys = {name: _keys(name, number, calls, guard) for name in names}  # tokens: untimed
            per_round.append(_round(calling, keys, block, number % len(names), redis_pid))
        stats = _commandstats_pass(server.client(), calling, calls, guard)
        phases: dict[str, Any] = {}
        for phase in ("first", "replay"):
            summary: dict[str, Any] = {}
            for name in names:
                for figure in ("us", "per_s", "redis_cpu_us", "client_cpu_us"):
                    summary[f"{name}_{figure}"] = statistics.median(r[name][phase][figure] for r in per_round)

            def paired(name: str, figure: str, rounds_: list[Any] = per_round, phase_: str = phase) -> Any:
                """ours / Powertools of ``figure``, per round (both measured under the same load)."""
                return _spread([r[name][phase_][figure] / r["powertools"][phase_][figure] for r in rounds_])

            for name in ("ours", "ours_no_renewal"):  # latency: below 1 is faster
                summary[f"{name}_ratio"] = paired(name, "us")
            summary["ours_redis_cpu_ratio"] = paired("ours", "redis_cpu_us")
            summary["ours_client_cpu_ratio"] = paired("ours", "client_cpu_us")
            summary["guard_throughput_ratio"] = paired("guard", "per_s")  # above 1 is faster
            phases[phase] = summary
        return {
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_average_at_start": load_at_start,
            "load_average": os.getloadavg()[0],
            "cpus": os.cpu_count(),
            "rounds": rounds,
            "calls": calls,
            "block": block,
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
        spread = phases[phase][key]
        measured = spread["median"]
        met = measured <= target if sense == "<=" else measured >= target
        checked.append(
            {
                "budget": label,
                "measured": measured,
                "range": [spread["low"], spread["high"]],
                "middle_half": [spread["q1"], spread["q3"]],
                "target": f"{sense} {target}x",
                "met": met,
            }
        )
    return checked


def _ratio(spread: dict[str, float]) -> str:
    """A paired ratio as RESULTS.md shows it: median (middle half; range)."""
    return (
        f"{spread['median']:.2f}x ({spread['q1']:.2f}-{spread['q3']:.2f}; "
        f"{spread['low']:.2f}-{spread['high']:.2f})"
    )


def section(result: dict[str, Any], instructions: dict[str, Any] | None = None) -> str:
    versions = ", ".join(f"{name} {version}" for name, version in result["versions"].items())
    rows = []
    cpu_rows = []
    for label, phase in (("first execution", "first"), ("replay", "replay")):
        p = result["phases"][phase]
        rows.append(
            f"| {label} | {p['ours_us']:.0f} | {p['ours_no_renewal_us']:.0f} | {p['guard_us']:.0f} | "
            f"{p['powertools_us']:.0f} | {_ratio(p['ours_ratio'])} | {_ratio(p['ours_no_renewal_ratio'])} | "
            f"{p['guard_per_s']:.0f} / {p['powertools_per_s']:.0f}: {_ratio(p['guard_throughput_ratio'])} |"
        )
        cpu_rows.append(
            f"| {label} | {p['ours_redis_cpu_us']:.1f} | {p['guard_redis_cpu_us']:.1f} | "
            f"{p['powertools_redis_cpu_us']:.1f} | {_ratio(p['ours_redis_cpu_ratio'])} | "
            f"{p['ours_client_cpu_us']:.0f} / {p['powertools_client_cpu_us']:.0f}: "
            f"{_ratio(p['ours_client_cpu_ratio'])} |"
        )
    budget_rows = [
        f"| {b['budget']} | {b['measured']:.2f}x ({b['middle_half'][0]:.2f}-{b['middle_half'][1]:.2f}; "
        f"{b['range'][0]:.2f}-{b['range'][1]:.2f}) | {b['target']} | {'yes' if b['met'] else '**NO**'} |"
        for b in result["budgets"]
    ]
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
        f"Run {result.get('when', '?')}: {result['rounds']} rounds of {result['calls']} keys per contender;",
        f"within a round the contenders take turns {result.get('block', '?')} calls at a time (first",
        "executions, then replays), the order rotated every turn, so all of them run under the same",
        'load (README.md, "Reading the numbers"). Median latency per call (µs), median over rounds.',
        "A ratio is `ours / Powertools` taken within each round, then its median over rounds, with",
        "the middle half of the rounds and their whole range in brackets (below 1: ours is faster);",
        "the guard's is a throughput ratio (calls/s of the median turn, `guard / Powertools`, above 1:",
        "the guard is faster). `@idempotent` and the guard renew their lease in the background",
        "while the function runs (the default: a heap entry on the process's renewal scheduler,",
        "taken off when the call ends); `renew=False` leaves that out, as Powertools does (its",
        "in-progress record simply expires).",
        "",
        "| phase | `@idempotent` (µs) | renew=False (µs) | guard (µs) | Powertools (µs) | "
        "`@idempotent` ratio | renew=False ratio | guard/Powertools calls/s |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "CPU per call (µs), median over rounds: redis-server's (user + system, every thread, from",
        "/proc/PID/task/*/schedstat, network work included) and the calling thread's own",
        "(`time.thread_time_ns`), each with `@idempotent / Powertools` paired per round:",
        "",
        "| phase | redis-server: `@idempotent` | guard | Powertools | `@idempotent` / Powertools | "
        "caller: `@idempotent` / Powertools |",
        "|---|---|---|---|---|---|",
        *cpu_rows,
        "",
        "`INFO commandstats` of each contender alone after the rounds, per call (commands per call,",
        "µs per command; a script's µs include the commands it runs):",
        "",
        "| contender, phase | commands |",
        "|---|---|",
        *stat_rows,
        "",
        "Budgets (issues 24 and 32), from this run (median of the per-round ratios; middle half;",
        "range):",
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


def _instruction_table(runs: dict[str, Any]) -> list[str]:
    labels = list(runs)
    rows = []
    for contender in ("ours", "guard", "powertools"):
        for phase in ("first", "replay"):
            cells = []
            for label in labels:
                value = runs[label].get(contender, {}).get(phase)
                cells.append(f"{value / 1000:.0f} k" if value else "-")
            rows.append(f"| {contender}, {phase} | " + " | ".join(cells) + " |")
    return ["| contender, phase | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels), *rows]


def _instruction_lines(instructions: dict[str, Any]) -> list[str]:
    """The callgrind tables: instructions per call in the calling process, and redis-server's."""
    lines = [
        "Instructions per call in the calling process (`python -m benchmarks.functions --callgrind`:",
        "`valgrind --tool=callgrind` on N and 2N calls against a real redis-server, the",
        "difference per call: load-independent; redis-server's own work is not counted).",
        "",
        *_instruction_table(instructions["runs"]),
        *(["", *instructions["notes"]] if instructions.get("notes") else []),
    ]
    if instructions.get("redis_runs"):
        lines += [
            "",
            "redis-server's instructions per call (`--callgrind-redis`: the server under callgrind,",
            "its counters zeroed before a phase and read after it; user space only, the kernel's",
            "share of the network work, the same two round trips for `@idempotent` and Powertools,",
            "is not in them):",
            "",
            *_instruction_table(instructions["redis_runs"]),
        ]
    return lines


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
    # keys of this run's own (one server serves every run: another run's keys would be replays)
    keys = _keys(name, os.getpid(), calls, guard)
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


def callgrind_redis(calls: int) -> dict[str, dict[str, int]]:
    """redis-server's instructions per call of each contender, first execution and replay."""
    server = CallgrindRedis().start()
    try:
        # serverCron runs hz times a second of wall time, and under valgrind a call takes 50x
        # as long: at the default 10 its share of a call (memory stats, expiry) moved with the
        # machine's load by several k instructions; at 1 it is a tenth of that
        server.client().config_set("hz", 1)
        guard = _Guard(server.url)
        contenders: dict[str, Call] = {"ours": _ours(server.url)[0], "guard": guard}
        contenders["powertools"] = _powertools(server.url)[0]
        counts: dict[str, dict[str, int]] = {}
        for name, call in contenders.items():
            for key in _keys(name, -1, 20, guard):  # warm up
                call(key)
                call(key)
            keys = _keys(name, 0, calls, guard)
            server.instructions()  # zeroed: the tokens' issue is not counted
            for key in keys:
                call(key)
            first = server.instructions()
            for key in keys:
                call(key)
            counts[name] = {"first": first // calls, "replay": server.instructions() // calls}
        return counts
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--block", type=int, default=25, help="calls a contender makes per turn")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--no-results", action="store_true", help="do not touch RESULTS.md")
    parser.add_argument("--callgrind", metavar="LABEL", help="count instructions; record them under LABEL")
    parser.add_argument(
        "--callgrind-redis",
        metavar="LABEL",
        help="count redis-server's instructions instead",
    )
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
    if args.callgrind or args.callgrind_redis:
        instructions = instructions or {"runs": {}}
        if args.callgrind:
            runs, label, counted = "runs", args.callgrind, callgrind(args.calls)
        else:
            runs, label, counted = "redis_runs", args.callgrind_redis, callgrind_redis(args.calls)
        instructions.setdefault(runs, {})[label] = counted
        instructions_path.write_text(json.dumps(instructions, indent=2) + "\n")
        print(json.dumps(counted, indent=2))
        return
    result = run(args.rounds, args.calls, args.block)
    (args.out / "functions.json").write_text(json.dumps(result, indent=2) + "\n")
    text = section(result, instructions)
    if not args.no_results:
        write_results(args.out / "RESULTS.md", text)
    print(text)


if __name__ == "__main__":
    main()
