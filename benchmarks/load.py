"""Drive HTTP load with wrk (Debian's ``wrk`` package) and read its figures.

Each run is one ``wrk -t1 -c<connections> -d<seconds>`` with a Lua script from
``benchmarks/wrk/`` that builds the POST bodies; ``report.lua`` is appended so
wrk prints its summary as one JSON line. One wrk thread is plenty for a
Python service on two cores and leaves the most CPU to the servers.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.procs import cpu_seconds, require

WRK_DIR = Path(__file__).resolve().parent / "wrk"


@dataclass(frozen=True)
class WrkResult:
    connections: int
    requests: int
    seconds: float
    rps: float
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    errors: int  # socket errors, timeouts and non-2xx replies together
    # CPU the server side (gunicorn master + workers, redis-server) spent per request:
    # robust to a busy machine, where throughput is not
    server_cpu_ms: float = 0.0
    redis_cpu_ms: float = 0.0  # the redis-server part of server_cpu_ms

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def script(name: str, delay_ms: float | None = None) -> Path:
    """The op script + the reporter (+ a pacing delay), as one temp file for wrk."""
    text = (WRK_DIR / f"{name}.lua").read_text() + "\n" + (WRK_DIR / "report.lua").read_text()
    if delay_ms:
        # a random 0.5..1.5 x delay after each reply holds each connection near a rate
        text += f"\nfunction delay()\n  return {delay_ms:.3f} * (0.5 + math.random())\nend\n"
    with tempfile.NamedTemporaryFile("w", prefix=f"bench-{name}-", suffix=".lua", delete=False) as handle:
        handle.write(text)
    return Path(handle.name)


def run_wrk(
    url: str,
    name: str,
    args: Sequence[str] = (),
    *,
    connections: int,
    seconds: float,
    delay_ms: float | None = None,
    server_pids: Sequence[int] = (),
    redis_pids: Sequence[int] = (),
) -> WrkResult:
    path = script(name, delay_ms)
    command = [
        require("wrk", "apt-get install wrk"),
        "-t1",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "--timeout",
        "10s",
        "-s",
        str(path),
        url,
        "--",
        *args,
    ]
    cpu_before, redis_before = cpu_seconds(server_pids), cpu_seconds(redis_pids)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60, check=False)
    finally:
        path.unlink(missing_ok=True)
    redis_cpu = cpu_seconds(redis_pids) - redis_before
    server_cpu = cpu_seconds(server_pids) - cpu_before + redis_cpu
    lines = [line for line in done.stdout.splitlines() if line.startswith("BENCH_JSON ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout}\n{done.stderr}")
    raw = json.loads(lines[-1].removeprefix("BENCH_JSON "))
    seconds_run = raw["duration_us"] / 1e6
    errors = sum(
        raw[k] for k in ("connect_errors", "read_errors", "write_errors", "status_errors", "timeouts")
    )
    return WrkResult(
        connections=connections,
        requests=raw["requests"],
        seconds=seconds_run,
        rps=raw["requests"] / seconds_run,
        mean_ms=raw["mean_us"] / 1000,
        p50_ms=raw["p50_us"] / 1000,
        p90_ms=raw["p90_us"] / 1000,
        p99_ms=raw["p99_us"] / 1000,
        errors=errors,
        server_cpu_ms=server_cpu * 1000 / max(1, raw["requests"]),
        redis_cpu_ms=redis_cpu * 1000 / max(1, raw["requests"]),
    )


def median_of(results: Sequence[WrkResult], field: str) -> float:
    return float(statistics.median(getattr(r, field) for r in results))
