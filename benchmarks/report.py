"""Turn one run's figures into RESULTS.md, results.json and the plot."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.procs import REPO_ROOT

PLOT_NAME = "results.png"

# (key, what, target, test) — the budgets, each checked on this run's figures.
Budget = tuple[str, str, str, Callable[[dict[str, Any]], tuple[str, str, str, bool]]]


def machine() -> dict[str, str]:
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        found = re.search(r"model name\s*:\s*(.+)", cpuinfo.read_text())
        cpu = found.group(1).strip() if found else cpu
    memory = "unknown"
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        found = re.search(r"MemTotal:\s*(\d+)", meminfo.read_text())
        memory = f"{int(found.group(1)) / 1024 / 1024:.1f} GiB" if found else memory
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory": memory,
        "kernel": platform.release(),
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def _command_version(command: list[str]) -> str:
    if shutil.which(command[0]) is None:
        return "not installed"
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    return (done.stdout or done.stderr).strip().splitlines()[0]


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in ("flask", "werkzeug", "gunicorn", "marshmallow", "redis", "hiredis", "orjson"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    found["redis-server"] = _command_version(["redis-server", "--version"])
    found["wrk"] = _command_version(["wrk", "--version"])
    commit = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    found["token-service commit"] = commit.stdout.strip() or "unknown"
    return found


_FASTAPI = "hand-written FastAPI, uvicorn"
# (what, pair of targets, the bottom one's description, target ratio, as written)
PAIRED_BUDGETS = (
    (
        "vs the baseline on sync workers",
        "service / baseline-sync",
        "hand-written Flask, sync workers",
        1.5,
        ">= 1.5x",
    ),
    ("vs FastAPI + uvicorn (stretch)", "service / fastapi", _FASTAPI, 0.9, ">= 0.9x (stretch)"),
    ("on granian vs FastAPI + uvicorn", "granian / fastapi", _FASTAPI, 1.0, ">= 1.0x (stretch 1.2x)"),
)


def budgets(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def row(name: str, value: str, baseline: str, ratio: str, target: str, met: bool) -> None:
        rows.append(
            {
                "budget": name,
                "value": value,
                "baseline": baseline,
                "ratio": ratio,
                "target": target,
                "met": met,
            }
        )

    for endpoint in ("generate", "consume"):
        peak = results["peak"][endpoint]
        pairs = peak.get("pairs", {})
        if "ratio" in peak:
            row(
                f"POST /token/{endpoint} vs the baseline on the shipped workers",
                f"{peak['service']['rps']:.0f} req/s",
                f"{peak['baseline']['rps']:.0f} req/s (hand-written Flask, gevent workers)",
                f"{peak['ratio']:.2f}x (CPU {peak['cpu_ratio']:.2f}x)",
                ">= 1.0x",
                peak["ratio"] >= 1.0,
            )
        for name, pair, against, target, goal in PAIRED_BUDGETS:
            top, bottom = pair.split(" / ")
            ratios = pairs.get(pair)
            if ratios is not None:
                row(
                    f"POST /token/{endpoint} {name}",
                    f"{peak[top]['rps']:.0f} req/s",
                    f"{peak[bottom]['rps']:.0f} req/s ({against})",
                    f"{ratios['ratio']:.2f}x (CPU {ratios['cpu_ratio']:.2f}x)",
                    goal,
                    ratios["ratio"] >= target,
                )
    fast = results.get("half_peak_granian")
    if fast is not None:
        row(
            "p99 of generate at half of peak, granian",
            f"{fast['p99_ms']:.2f} ms at {fast['rps']:.0f} req/s",
            f"peak {results['peak']['generate']['granian']['rps']:.0f} req/s, "
            f"FastAPI p99 {fast['baseline']['p99_ms']:.2f} ms",
            f"{fast['rps'] / results['peak']['generate']['granian']['rps']:.2f} of peak",
            "<= 5 ms",
            fast["p99_ms"] <= 5,
        )
    half = results["half_peak"]
    baseline_p99 = f", baseline p99 {half['baseline']['p99_ms']:.2f} ms" if "baseline" in half else ""
    row(
        "p99 of generate at half of peak",
        f"{half['p99_ms']:.2f} ms at {half['rps']:.0f} req/s",
        f"peak {results['peak']['generate']['service']['rps']:.0f} req/s{baseline_p99}",
        f"{half['rps'] / results['peak']['generate']['service']['rps']:.2f} of peak",
        "<= 5 ms",
        half["p99_ms"] <= 5,
    )
    direct = results["direct"]
    raw = direct["ops_per_second"]["redis-py EVALSHA"]
    for name, rate in direct["ops_per_second"].items():
        if name == "redis-py EVALSHA":
            continue
        row(
            f"direct consume: {name}",
            f"{rate:.0f} ops/s",
            f"{raw:.0f} ops/s (redis-py EVALSHA)",
            f"{direct['ratios'][name]:.2f}x (CPU {direct['cpu_ratios'][name]:.2f}x)",
            ">= 0.9x",
            direct["ratios"][name] >= 0.9,
        )
    batch = results["batch"]
    row(
        "POST /token/generate/batch (1000 tokens)",
        f"{batch['tokens_per_second']:.0f} tokens/s",
        "-",
        "-",
        ">= 100000 tokens/s",
        batch["tokens_per_second"] >= 100_000,
    )
    memory = results["memory"]
    row(
        "Redis memory per ISSUED token",
        f"{memory['bytes_per_token']:.1f} B",
        "-",
        "-",
        "<= 170 B",
        memory["bytes_per_token"] <= 170,
    )
    return rows


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(results: dict[str, Any]) -> str:
    config = results["config"]
    out = [
        "# Benchmark results",
        "",
        f"Generated by `{results['command']}` on {results['started']} in {results['elapsed_seconds']:.0f} s"
        + (" — QUICK MODE: these figures only show that the harness runs." if config["quick"] else "."),
        "Every ratio compares two things measured in this same run, alternated (A B, B A, ...);",
        "a ratio is the median over rounds of the pair measured in the same round; other figures are",
        "medians.",
        "",
        "## Budgets",
        "",
        _table(
            ["budget", "measured", "baseline", "ratio", "target", "met"],
            [
                [
                    b["budget"],
                    b["value"],
                    b["baseline"],
                    b["ratio"],
                    b["target"],
                    "yes" if b["met"] else "**NO**",
                ]
                for b in results["budgets"]
            ],
        ),
        "",
        "A replay of a SUCCEEDED token costs exactly one Redis round trip: checked by a test",
        "(`tests/perf/test_round_trips.py`, counting commands with MONITOR), not timed here.",
        "",
        "## Machine and versions",
        "",
        _table(["", ""], [[k, v] for k, v in {**results["machine"], **results["versions"]}.items()]),
        "",
        f"Servers: gunicorn `{results['gunicorn']}` with {config['workers']} workers (gevent, the",
        "config's default), the same flags for the service and the baseline; `-sync` / `-gthread`",
        "targets add `--worker-class sync` / `--worker-class gthread --threads 4`; the FastAPI twin runs",
        f"under uvicorn with {config['workers']} workers (uvloop, httptools, no access log); one private",
        "redis-server on a free port; wrk with one thread, keep-alive connections.",
        f"Load average at the end: {results['load_at_end']}. Failed requests (socket errors, timeouts, "
        f"non-2xx) over all wrk runs: {results.get('failed_requests', 0)}.",
        "",
        "## HTTP: service vs hand-written baseline",
        "",
        f"{config['peak_connections']} connections, {config['rounds']} rounds of "
        f"{config['seconds']:.0f} s each.",
        "",
        _table(
            [
                "endpoint",
                "service req/s",
                "baseline req/s",
                "ratio (paired)",
                "ratio of medians",
                "round ratios",
                "service p50 / p99 ms",
                "baseline p50 / p99 ms",
                "server CPU ms/req service / baseline (of which Redis)",
                "CPU ratio",
            ],
            [
                [
                    endpoint,
                    f"{p['service']['rps']:.0f}",
                    f"{p['baseline']['rps']:.0f}",
                    f"{p['ratio']:.2f}",
                    f"{p.get('ratio_of_medians', p['ratio']):.2f}",
                    ", ".join(f"{r:.2f}" for r in p["round_ratios"]),
                    f"{p['service']['p50_ms']:.2f} / {p['service']['p99_ms']:.2f}",
                    f"{p['baseline']['p50_ms']:.2f} / {p['baseline']['p99_ms']:.2f}",
                    f"{p['service']['server_cpu_ms']:.3f} ({p['service']['redis_cpu_ms']:.3f}) / "
                    f"{p['baseline']['server_cpu_ms']:.3f} ({p['baseline']['redis_cpu_ms']:.3f})",
                    f"{p['cpu_ratio']:.2f}",
                ]
                for endpoint, p in results["peak"].items()
            ],
        ),
        "",
        "Server CPU is what gunicorn (master and workers) and redis-server used per request, read",
        "from /proc around each run; the CPU ratio (baseline CPU / service CPU, paired per round) is the",
        "throughput ratio an otherwise idle machine would show, and moves far less than throughput on a",
        "shared one. The order of the pair is swapped every round, so neither always runs second.",
        "",
        *_worker_classes(results["peak"]),
        *_baselines(results["peak"]),
        "## Throughput and latency vs concurrency",
        "",
        f"![throughput and latency vs concurrency]({PLOT_NAME})",
        "",
        _table(
            ["endpoint", "target", "connections", "req/s", "p50 ms", "p99 ms"],
            [
                [
                    p["endpoint"],
                    p["target"],
                    p["connections"],
                    f"{p['rps']:.0f}",
                    f"{p['p50_ms']:.2f}",
                    f"{p['p99_ms']:.2f}",
                ]
                for p in results["curve"]
            ],
        ),
        "",
        *_app_cpu(results.get("app_cpu")),
        "## Latency of generate at half of peak",
        "",
        _half_peak(results["half_peak"]),
        "",
        "## Batch issue",
        "",
        _batch(results["batch"]),
        "",
        "## SDK direct transport: consume in one Python process",
        "",
        _direct(results["direct"]),
        "",
        "## Redis memory per outstanding token",
        "",
        _memory(results["memory"]),
        "",
        "## The Redis ceiling on this machine (redis-benchmark)",
        "",
        _table(
            ["test", "ops/s", "p50 ms", "p99 ms"],
            [
                [r["test"], f"{r['rps']:.0f}", f"{r['p50_ms']:.3f}", f"{r['p99_ms']:.3f}"]
                for r in results["redis"]
            ],
        ),
        "",
    ]
    return "\n".join(out)


WORKER_CLASS_TARGETS = (("sync", "service-sync"), ("gthread", "service-gthread"), ("gevent", "service"))


def _worker_classes(peak: dict[str, Any]) -> list[str]:
    """The service on each worker class: same app, same worker count, same rounds."""
    if "service-sync" not in peak.get("generate", {}):
        return []  # results from before this part existed
    rows = []
    for endpoint, p in peak.items():
        for worker_class, target in WORKER_CLASS_TARGETS:
            t = p[target]
            paired = p["pairs"].get(f"{target} / service-sync")
            rows.append(
                [
                    endpoint,
                    worker_class,
                    f"{t['rps']:.0f}",
                    f"{t['p50_ms']:.2f} / {t['p99_ms']:.2f}",
                    f"{t['server_cpu_ms']:.3f}",
                    "1.00" if target == "service-sync" else (f"{paired['ratio']:.2f}" if paired else "-"),
                    "1.00" if target == "service-sync" else (f"{paired['cpu_ratio']:.2f}" if paired else "-"),
                ]
            )
    return [
        "## Worker classes: the service on sync, gthread and gevent workers",
        "",
        "The same app and worker count; only `--worker-class` differs (gthread with 4 threads).",
        "Ratios are to sync, paired within rounds. docs/performance.md says why gevent is the default.",
        "",
        _table(
            [
                "endpoint",
                "worker class",
                "req/s",
                "p50 / p99 ms",
                "server CPU ms/req",
                "throughput vs sync",
                "CPU vs sync",
            ],
            rows,
        ),
        "",
    ]


BASELINE_TARGETS = (
    ("the service (gevent)", "service"),
    ("hand-written Flask, gevent", "baseline"),
    ("hand-written Flask, sync", "baseline-sync"),
    ("hand-written FastAPI, uvicorn", "fastapi"),
    ("the service on granian", "granian"),
)


def _baselines(peak: dict[str, Any]) -> list[str]:
    if "fastapi" not in peak.get("generate", {}):
        return []
    rows = []
    for endpoint, p in peak.items():
        for label, target in BASELINE_TARGETS:
            if target not in p:
                continue  # results from before granian was a target
            t = p[target]
            paired = p["pairs"].get(f"service / {target}")
            ratio = (
                "1.00"
                if target == "service"
                else (f"{paired['ratio']:.2f}" if paired else f"{p['ratio']:.2f}")
            )
            rows.append(
                [
                    endpoint,
                    label,
                    f"{t['rps']:.0f}",
                    f"{t['p50_ms']:.2f} / {t['p99_ms']:.2f}",
                    f"{t['server_cpu_ms']:.3f}",
                    ratio,
                    ", ".join(f"{v:.0f}" for v in t["all_rps"]),
                ]
            )
    return [
        "## The service and its three baselines",
        "",
        "service / target, paired within rounds (above 1: the service is faster).",
        "",
        _table(
            [
                "endpoint",
                "target",
                "req/s",
                "p50 / p99 ms",
                "server CPU ms/req",
                "service / target",
                "per round",
            ],
            rows,
        ),
        "",
    ]


def _app_cpu(app_cpu: dict[str, Any] | None) -> list[str]:
    if not app_cpu:
        return []  # results from before this part existed
    rows = [
        [
            endpoint,
            f"{e['service_us']:.0f}",
            f"{e['baseline_us']:.0f}",
            f"{e['ratio']:.2f}",
            ", ".join(f"{v:.0f}" for v in e["all_service_us"]),
            ", ".join(f"{v:.0f}" for v in e["all_baseline_us"]),
        ]
        for endpoint, e in app_cpu["endpoints"].items()
    ]
    return [
        "## Application CPU per request (in process, no server)",
        "",
        f"`python -m benchmarks.app_cpu`: each app's WSGI callable called directly, "
        f"{app_cpu['requests_per_round']} requests per round, {app_cpu['rounds']} rounds A B A B, "
        "this process's CPU per request (waiting for Redis not counted); metrics and JSON access "
        "lines on, as under gunicorn. The ratio is baseline / service: above 1, the service's "
        "application code costs less than the hand-written baseline's.",
        "",
        _table(
            ["endpoint", "service us", "baseline us", "ratio", "service per round", "baseline per round"],
            rows,
        ),
        "",
    ]


def _half_peak(half: dict[str, Any]) -> str:
    text = (
        f"Target {half['target_rps']:.0f} req/s (half the service's peak) with {half['connections']} "
        f"connections pacing a mean {half['delay_ms']:.2f} ms between requests: achieved "
        f"{half['rps']:.0f} req/s, p50 {half['p50_ms']:.2f} ms, **p99 {half['p99_ms']:.2f} ms** "
        f"(runs: {', '.join(f'{v:.2f}' for v in half['all_p99_ms'])} ms). wrk 4 is closed-loop, so this "
        "p99 does not include queueing a stall would cause under an open-loop load (no wrk2 in Debian)."
    )
    baseline = half.get("baseline")
    if baseline:
        text += (
            f" The hand-written baseline under the same pacing, alternated with the service: "
            f"{baseline['rps']:.0f} req/s, p50 {baseline['p50_ms']:.2f} ms, p99 {baseline['p99_ms']:.2f} ms "
            f"(runs: {', '.join(f'{v:.2f}' for v in baseline['all_p99_ms'])} ms) -- the part of the tail "
            "both share is this machine's."
        )
    return text


def _batch(batch: dict[str, Any]) -> str:
    return (
        f"`POST /token/generate/batch` with `count: 1000`, {batch['connections']} connections: "
        f"**{batch['tokens_per_second']:.0f} tokens/s** end to end (p50 {batch['p50_ms']:.1f} ms, "
        f"p99 {batch['p99_ms']:.1f} ms per request; server CPU {batch['server_cpu_ms']:.1f} ms "
        "per request; runs: "
        f"{', '.join(str(v) for v in batch['all_tokens_per_second'])})."
    )


def _direct(direct: dict[str, Any]) -> str:
    quartiles = direct.get("ratio_quartiles", {})
    rows = [
        [
            name,
            f"{rate:.0f}",
            f"{direct['ratios'][name]:.2f}",
            "-".join(f"{q:.2f}" for q in quartiles.get(name, [])) or "-",
            f"{direct['cpu_us_per_op'][name]:.1f}",
            f"{direct['cpu_ratios'][name]:.2f}",
        ]
        for name, rate in direct["ops_per_second"].items()
    ]
    text = (
        f"{direct['ops_per_round']} consumes of fresh tokens per contender per round, "
        f"{direct['rounds']} rounds, one connection, sequential. The raw baseline runs a small "
        "GET/SET Lua script with a precomputed key. Each round runs the contenders in an order "
        f"drawn from seed {direct.get('seed', '-')} so that each is first, middle and last "
        "equally often; a ratio is taken within each round against the raw EVALSHA of that "
        "round, and the table gives the median (and quartiles) over rounds. CPU is this "
        "process's plus redis-server's per op; its ratio is what a quiet machine would show.\n\n"
        + _table(["contender", "ops/s", "ratio", "ratio IQR", "CPU us/op", "CPU ratio"], rows)
    )
    per_round = direct.get("round_ratios")
    if per_round:
        lines = [
            f"- {name}: {', '.join(f'{v:.2f}' for v in values)}"
            for name, values in per_round.items()
            if name != "redis-py EVALSHA"
        ]
        text += "\n\nPer-round ratios (ops/s vs raw EVALSHA of the same round):\n\n" + "\n".join(lines)
    else:
        lines = [
            f"- {name}: {', '.join(str(v) for v in values)}"
            for name, values in direct["all_ops_per_second"].items()
        ]
        text += "\n\nops/s per round:\n\n" + "\n".join(lines)
    return text


def _memory(memory: dict[str, Any]) -> str:
    text = (
        f"{memory['tokens']} ISSUED tokens, scope `{memory['scope']}`, subjects like "
        f"`{memory['subject_example']}` ({memory['subjects']} subjects), on an empty database: "
        f"`INFO memory` used_memory grew by **{memory['bytes_per_token']:.1f} bytes per token** "
        f"({memory['keys']} keys)."
    )
    if "per_client" in memory:
        client = memory["per_client"]
        text += (
            f" The issuance limiter keeps one record per client: {client['bytes_per_client']:.0f} bytes each "
            f"({client['clients']} clients, {client['tokens_per_client']} tokens each) — "
            f"{client['bytes_per_token']:.1f} bytes per token on top, "
            f"{memory['bytes_per_token'] + client['bytes_per_token']:.1f} bytes per token in all."
        )
    return text


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    colours = {
        "service": "tab:blue",
        "baseline": "tab:orange",
        "baseline-sync": "tab:red",
        "fastapi": "tab:green",
        "granian": "tab:purple",
    }
    labels = {
        "service": "token-service (gevent)",
        "baseline": "hand-written Flask (gevent)",
        "baseline-sync": "hand-written Flask (sync)",
        "fastapi": "hand-written FastAPI (uvicorn)",
        "granian": "token-service (granian)",
    }
    for column, endpoint in enumerate(("generate", "consume")):
        throughput, latency = axes[0][column], axes[1][column]
        for target in colours:
            points = sorted(
                (p for p in results["curve"] if p["endpoint"] == endpoint and p["target"] == target),
                key=lambda p: p["connections"],
            )
            if not points:
                continue
            xs = [p["connections"] for p in points]
            label = labels[target]
            throughput.plot(xs, [p["rps"] for p in points], "o-", color=colours[target], label=label)
            latency.plot(xs, [p["p50_ms"] for p in points], "o-", color=colours[target], label=f"{label} p50")
            latency.plot(
                xs, [p["p99_ms"] for p in points], "s--", color=colours[target], label=f"{label} p99"
            )
        throughput.set_title(f"POST /token/{endpoint}: throughput")
        throughput.set_ylabel("requests / s")
        throughput.set_ylim(bottom=0)
        latency.set_title(f"POST /token/{endpoint}: latency")
        latency.set_ylabel("ms")
        latency.set_yscale("log")
        latency.set_xlabel("concurrent connections (wrk)")
        for axis in (throughput, latency):
            axis.set_xscale("log", base=2)
            axis.set_xticks(
                results["config"]["concurrencies"], [str(c) for c in results["config"]["concurrencies"]]
            )
            axis.grid(True, which="both", alpha=0.3)
            axis.legend(fontsize=8)
    figure.suptitle(
        f"token-service vs hand-written baselines, {results['config']['workers']} workers each, "
        f"{results['machine']['cores']} cores ({results['started']})",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def write(results: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, out_dir / PLOT_NAME)
    path = out_dir / "RESULTS.md"
    # sections other entry points own (benchmarks.limiter) survive a run of the suite
    kept = kept_sections(path.read_text()) if path.exists() else ""
    path.write_text(markdown(results) + kept)
    return path


KEPT_START = "<!-- section: "
KEPT_END = "<!-- end of section -->"


def kept_sections(text: str) -> str:
    """The marked sections of a previous RESULTS.md (``<!-- section: name -->`` … end)."""
    kept = []
    start = text.find(KEPT_START)
    while start != -1:
        end = text.find(KEPT_END, start)
        if end == -1:
            break
        kept.append(text[start : end + len(KEPT_END)])
        start = text.find(KEPT_START, end)
    return "".join("\n" + section + "\n" for section in kept)


def replace_section(text: str, name: str, body: str) -> str:
    """``text`` with the marked section ``name`` replaced by ``body`` (appended if absent)."""
    block = f"{KEPT_START}{name} -->\n{body.strip()}\n{KEPT_END}"
    start = text.find(f"{KEPT_START}{name} -->")
    if start == -1:
        return text.rstrip("\n") + "\n\n" + block + "\n"
    end = text.find(KEPT_END, start) + len(KEPT_END)
    return text[:start] + block + text[end:]
