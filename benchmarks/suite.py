"""The measurements: each function runs one part of the suite and returns plain data.

``run_suite`` starts one private redis-server, the service and the
hand-written baseline (both under gunicorn with the same flags), then runs
every part, alternating service and baseline A B A B and keeping medians.
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from benchmarks import baseline_app
from benchmarks.load import WrkResult, median_of, run_wrk
from benchmarks.procs import (
    WORKER_CLASSES,
    GranianServe,
    Gunicorn,
    RedisServer,
    Uvicorn,
    cpu_seconds_precise,
    require,
)
from token_service.client import TokenClient
from token_service.config import RateLimit
from token_service.limits import IssuanceLimits, client_key
from token_service.records import IssueRequest, UseRequest
from token_service.scripts import admit_issue_source, lua_source
from token_service.store import TokenStore

API_KEY = "bench-service-key-0123456789"
SCOPE = "payment.create"
TTL_SECONDS = 900
# Distinct subjects in generate bodies: a realistic spread, not one hot user.
SUBJECTS = 10000
# wrk runs from one address, i.e. one client to the issuance limiter: the
# limits are raised (never turned off) so that they are checked and charged on
# every request but do not throttle the load generator.
SERVICE_ENV = {
    "TOKEN_SERVICE_API_KEYS": API_KEY,
    "TOKEN_SERVICE_RATE_LIMIT": "1000000000/second",
    "TOKEN_SERVICE_MAX_OUTSTANDING_PER_SUBJECT": "1000000000",
    "TOKEN_SERVICE_DEFAULT_TTL_SECONDS": str(TTL_SECONDS),
}


@dataclass
class Config:
    quick: bool = False
    rounds: int = 5
    seconds: float = 5.0
    curve_seconds: float = 3.0
    peak_connections: int = 8
    concurrencies: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    workers: int = 2
    # SDK direct transport: many short rounds, contender order rotated (see direct_transport)
    direct_rounds: int = 48
    direct_ops: int = 500
    direct_seed: int = 20261130
    memory_tokens: int = 100_000
    redis_benchmark_requests: int = 100_000
    app_cpu_requests: int = 3000

    @classmethod
    def quick_mode(cls) -> Config:
        """Checks the harness end to end in seconds; its figures mean nothing."""
        return cls(
            quick=True,
            rounds=1,
            seconds=1,
            curve_seconds=1,
            peak_connections=2,
            concurrencies=(2,),
            direct_rounds=6,
            direct_ops=100,
            memory_tokens=2000,
            redis_benchmark_requests=2000,
        )


SERVICE_APP = "token_service:create_app()"
BASELINE_APP = "benchmarks.baseline_app:create_app()"
FASTAPI_APP = "benchmarks.fastapi_app:app"
GRANIAN_APP = "token_service:create_app"  # a factory: granian --factory
# Every server of the run, by name. "service" and "baseline" run the project's gunicorn config
# as shipped (gevent workers); the others differ in the one thing their name says.
TARGETS = (
    "service",  # the service, gevent workers (the shipped config)
    "baseline",  # the hand-written Flask baseline, the same config
    "baseline-sync",  # the same baseline on gunicorn's default sync workers: what a user writes and runs
    "fastapi",  # the baseline's FastAPI twin under uvicorn (the third baseline)
    "service-sync",  # the worker-class comparison: the service on sync ...
    "service-gthread",  # ... and gthread workers (4 threads), the same worker count
    "granian",  # the service under granian (token-service serve --server granian): the fast server
)
# The targets of each peak comparison; the curve's (and the plot's) subset.
CURVE_TARGETS = ("service", "baseline", "baseline-sync", "fastapi", "granian")


def runs_the_service(target: str) -> bool:
    """Whether the target serves token-service (its tokens, its key), not a hand-written baseline."""
    return target.startswith("service") or target == "granian"


@dataclass
class Servers:
    redis: RedisServer
    by_name: dict[str, Gunicorn]

    @property
    def service(self) -> Gunicorn:
        return self.by_name["service"]

    @property
    def baseline(self) -> Gunicorn:
        return self.by_name["baseline"]

    def targets(self) -> list[tuple[str, Gunicorn]]:
        return list(self.by_name.items())


def make_server(name: str, redis_url: str, workers: int) -> Gunicorn:
    service_env = {**SERVICE_ENV, "TOKEN_SERVICE_REDIS_URL": redis_url}
    baseline_env = {"BENCH_REDIS_URL": redis_url}
    if name == "fastapi":
        return Uvicorn(FASTAPI_APP, baseline_env, workers)
    if name == "granian":
        return GranianServe(GRANIAN_APP, service_env, workers)
    app, _, worker_class = name.partition("-")
    flags = WORKER_CLASSES[worker_class or "gevent"]
    if app == "service":
        return Gunicorn(SERVICE_APP, service_env, workers, flags)
    return Gunicorn(BASELINE_APP, baseline_env, workers, flags)


@contextmanager
def servers(config: Config, names: tuple[str, ...] = TARGETS) -> Iterator[Servers]:
    redis_server = RedisServer().start()
    started: dict[str, Gunicorn] = {}
    try:
        for name in names:
            started[name] = make_server(name, redis_server.url, config.workers).start()
        yield Servers(redis_server, started)
    finally:
        for server in started.values():
            server.stop()
        redis_server.stop()


# -- tokens for consume ------------------------------------------------------------


class TokenSupply:
    """Fresh tokens for consume runs, written where wrk's consume.lua reads them."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.store = TokenStore(client)
        self.dir = Path(tempfile.mkdtemp(prefix="ts-bench-tokens-"))

    def service_tokens(self, count: int) -> list[str]:
        tokens: list[str] = []
        request = IssueRequest(SCOPE, None, None, TTL_SECONDS)
        while len(tokens) < count:
            tokens += self.store.issue(request, min(1000, count - len(tokens)))
        return tokens

    def baseline_tokens(self, count: int) -> list[str]:
        import secrets

        tokens = [secrets.token_urlsafe(32) for _ in range(count)]
        for start in range(0, count, 1000):
            pipe = self.client.pipeline(transaction=False)
            for token in tokens[start : start + 1000]:
                pipe.set(baseline_app.KEY_PREFIX + token, SCOPE, ex=TTL_SECONDS)
            pipe.execute()
        return tokens

    def file_for(self, target: str, count: int) -> Path:
        service = runs_the_service(target)
        tokens = self.service_tokens(count) if service else self.baseline_tokens(count)
        path = self.dir / f"{target}-{time.monotonic_ns()}.txt"
        path.write_text("\n".join(tokens) + "\n")
        return path


@dataclass
class HttpRunner:
    servers: Servers
    supply: TokenSupply
    # the fastest rate seen so far: sizes the token files of consume runs
    fastest_rps: float = 3000.0
    results: list[dict[str, Any]] = field(default_factory=list)

    def run(
        self, target: str, endpoint: str, connections: int, seconds: float, delay_ms: float | None = None
    ) -> WrkResult:
        server = self.servers.by_name[target]
        if endpoint == "consume":
            # wrk wraps around if it runs out: size generously (repeats would show as errors)
            count = int(self.fastest_rps * 1.6 * max(1, round(seconds))) + 1000
            tokens = self.supply.file_for(target, count)
            key = API_KEY if runs_the_service(target) else ""
            args = [str(tokens), SCOPE, key]
        elif endpoint == "generate":
            args, tokens = [SCOPE, str(SUBJECTS)], None
        else:
            args, tokens = [SCOPE, "1000"], None
        try:
            result = run_wrk(
                server.url,
                endpoint,
                args,
                connections=connections,
                seconds=seconds,
                delay_ms=delay_ms,
                server_pids=server.pids(),
                redis_pids=self.servers.redis.pids(),
            )
        finally:
            if tokens is not None:
                tokens.unlink(missing_ok=True)
        if result.errors:
            # kept, and reported: on a busy machine a timeout should not lose the whole run
            print(f"[bench] WARNING {target} {endpoint}: {result.errors} failed requests", file=sys.stderr)
        self.fastest_rps = max(self.fastest_rps, result.rps)
        self.results.append({"target": target, "endpoint": endpoint, **result.as_dict()})
        return result


# Paired ratios reported beside service / baseline: (numerator, denominator) targets.
PAIRS = (
    ("service", "baseline-sync"),
    ("service", "fastapi"),
    ("granian", "fastapi"),
    ("granian", "service"),
    ("service-gthread", "service-sync"),
    ("service", "service-sync"),
    ("baseline", "baseline-sync"),
)


def _round_orders(names: list[str], rounds: int) -> list[list[str]]:
    """Each round's order: rotated by one every round, reversed every other one (A B C, C B A ...).

    Two targets are only rotated (A B, B A, ...): rotating and reversing a pair gives it back
    unchanged, and the same one would always run first.
    """
    orders = []
    for round_number in range(rounds):
        shift = round_number % len(names)
        order = names[shift:] + names[:shift]
        reverse = round_number % 2 == 1 and len(names) > 2
        orders.append(order[::-1] if reverse else order)
    return orders


def _paired(runs: dict[str, list[WrkResult]], top: str, bottom: str) -> dict[str, Any]:
    pairs = list(zip(runs[top], runs[bottom], strict=True))
    cpu_pairs = [(a, b) for a, b in pairs if a.server_cpu_ms > 0]
    return {
        "ratio": statistics.median(a.rps / b.rps for a, b in pairs),
        "round_ratios": [round(a.rps / b.rps, 3) for a, b in pairs],
        "round_cpu_ratios": [round(b.server_cpu_ms / a.server_cpu_ms, 3) for a, b in cpu_pairs],
        # bottom CPU / top CPU per request: the throughput ratio a quiet machine would show
        "cpu_ratio": (
            statistics.median(b.server_cpu_ms / a.server_cpu_ms for a, b in cpu_pairs) if cpu_pairs else 0.0
        ),
    }


def compare_peak(
    runner: HttpRunner, config: Config, endpoint: str, targets: tuple[str, ...] = TARGETS
) -> dict[str, Any]:
    """Every target at the peak concurrency, in rounds; medians and the ratios paired within rounds.

    Each round runs every target once, in an order rotated every round and
    reversed every other one, so that none always runs first or after the
    same neighbour on a machine that has just warmed up. A ratio is the
    median over rounds of the pair measured in the same round: a pair
    measured seconds apart shares the machine's state, which drifts far more
    between rounds than within one (the ratio of the medians is kept beside
    it as ``ratio_of_medians``).
    """
    names = [name for name in targets if name in runner.servers.by_name]
    runs: dict[str, list[WrkResult]] = {name: [] for name in names}
    for order in _round_orders(names, config.rounds):
        for target in order:
            runs[target].append(runner.run(target, endpoint, config.peak_connections, config.seconds))
    summary: dict[str, Any] = {"connections": config.peak_connections, "rounds": config.rounds}
    for target, results in runs.items():
        summary[target] = {
            "rps": median_of(results, "rps"),
            "p50_ms": median_of(results, "p50_ms"),
            "p99_ms": median_of(results, "p99_ms"),
            "all_rps": [round(r.rps, 1) for r in results],
            "server_cpu_ms": median_of(results, "server_cpu_ms"),
            "redis_cpu_ms": median_of(results, "redis_cpu_ms"),
        }
    if "service" in runs and "baseline" in runs:
        main = _paired(runs, "service", "baseline")
        summary["round_ratios"] = main["round_ratios"]
        summary["ratio"] = main["ratio"]
        summary["ratio_of_medians"] = summary["service"]["rps"] / summary["baseline"]["rps"]
        summary["round_cpu_ratios"] = main["round_cpu_ratios"]
        summary["cpu_ratio"] = main["cpu_ratio"]
    summary["pairs"] = {
        f"{top} / {bottom}": _paired(runs, top, bottom)
        for top, bottom in PAIRS
        if top in runs and bottom in runs
    }
    return summary


def concurrency_curve(runner: HttpRunner, config: Config) -> list[dict[str, Any]]:
    points = []
    targets = [name for name in CURVE_TARGETS if name in runner.servers.by_name]
    for connections in config.concurrencies:
        for endpoint in ("generate", "consume"):
            for target in targets:
                result = runner.run(target, endpoint, connections, config.curve_seconds)
                points.append({"target": target, "endpoint": endpoint, **result.as_dict()})
    return points


def half_peak_latency(
    runner: HttpRunner, config: Config, peak_rps: float, target: str = "service", reference: str = "baseline"
) -> dict[str, Any]:
    """p99 of generate with the load held near half the measured peak.

    wrk 4 is closed-loop: each of the connections sends, waits for the reply,
    then waits a random delay (mean d). The rate is then about
    connections / (latency + d); d is calibrated once from a first run. Being
    closed-loop, a stall delays the next requests instead of queueing them, so
    this p99 is a floor, not what an open-loop (wrk2) load would show.
    """
    connections = max(2, config.peak_connections // 2)
    target_rps = peak_rps / 2
    delay_ms = connections / target_rps * 1000
    first = runner.run(target, "generate", connections, config.curve_seconds, delay_ms=delay_ms)
    # rate ~ connections / (time per request + delay): keep the measured time, fix the delay
    time_per_request_ms = connections / first.rps * 1000 - delay_ms
    delay_ms = max(0.05, connections / target_rps * 1000 - time_per_request_ms)
    # The reference (a hand-written baseline) under the same pacing, alternated with the target:
    # its p99 shows how much of the tail is this machine's rather than the service's.
    runs: list[WrkResult] = []
    baseline_runs: list[WrkResult] = []
    for round_number in range(max(1, config.rounds // 2 + 1)):
        order = (target, reference) if round_number % 2 == 0 else (reference, target)
        for name in order:
            result = runner.run(name, "generate", connections, config.seconds, delay_ms=delay_ms)
            (runs if name == target else baseline_runs).append(result)
    return {
        "target": target,
        "reference": reference,
        "connections": connections,
        "target_rps": target_rps,
        "delay_ms": delay_ms,
        "rps": median_of(runs, "rps"),
        "p50_ms": median_of(runs, "p50_ms"),
        "p99_ms": median_of(runs, "p99_ms"),
        "all_p99_ms": [r.p99_ms for r in runs],
        "baseline": {
            "rps": median_of(baseline_runs, "rps"),
            "p50_ms": median_of(baseline_runs, "p50_ms"),
            "p99_ms": median_of(baseline_runs, "p99_ms"),
            "all_p99_ms": [r.p99_ms for r in baseline_runs],
        },
    }


def batch_throughput(runner: HttpRunner, config: Config) -> dict[str, Any]:
    runs = [runner.run("service", "batch", config.workers, config.seconds) for _ in range(config.rounds)]
    return {
        "connections": config.workers,
        "tokens_per_request": 1000,
        "tokens_per_second": median_of(runs, "rps") * 1000,
        "p50_ms": median_of(runs, "p50_ms"),
        "p99_ms": median_of(runs, "p99_ms"),
        "server_cpu_ms": median_of(runs, "server_cpu_ms"),
        "all_tokens_per_second": [round(r.rps * 1000) for r in runs],
    }


# -- SDK direct transport vs raw redis-py EVALSHA -------------------------------------


def direct_transport(servers: Servers, config: Config) -> dict[str, Any]:
    """consume ops/s in one Python process: the store / SDK vs a bare EVALSHA.

    Many short rounds; in each, every contender consumes ``direct_ops`` fresh
    tokens, in an order drawn (seeded, recorded) so that over every block of
    rounds each contender runs first, middle and last equally often: none
    always runs after the others have warmed or heated the machine. A ratio is
    taken within each round (contender / raw EVALSHA of the same round), so
    drift between rounds cancels; the headline is the median of those.
    """
    client = servers.redis.client()
    supply = TokenSupply(client)
    sha = client.script_load(baseline_app.CONSUME_LUA)
    store = TokenStore(client)
    contenders: dict[str, Callable[[list[str]], None]] = {}

    def raw_evalsha(tokens: list[str]) -> None:
        for token in tokens:
            if client.evalsha(sha, 1, baseline_app.KEY_PREFIX + token, SCOPE) != 1:
                raise RuntimeError("raw EVALSHA did not consume")

    def store_consume(tokens: list[str]) -> None:
        for token in tokens:
            if store.consume(UseRequest(token, SCOPE)).replayed:
                raise RuntimeError("store consume replayed a fresh token")

    contenders[RAW_EVALSHA] = raw_evalsha
    contenders["TokenStore.consume"] = store_consume
    sdk = TokenClient.from_redis(client)

    def sdk_consume(tokens: list[str]) -> None:
        for token in tokens:
            if sdk.consume(token, SCOPE).replayed:
                raise RuntimeError("SDK consume replayed a fresh token")

    contenders["TokenClient.from_redis consume"] = sdk_consume
    names = list(contenders)

    def tokens_for(name: str, count: int) -> list[str]:
        return supply.baseline_tokens(count) if name == RAW_EVALSHA else supply.service_tokens(count)

    # warm up connections and script caches
    for name, run in contenders.items():
        run(tokens_for(name, 200))
    orders = direct_orders(names, config.direct_rounds, config.direct_seed)
    rates: dict[str, list[float]] = {name: [] for name in names}
    # CPU per op, this process plus redis-server (scheduler ns, not 10 ms ticks: rounds are short)
    cpu_us: dict[str, list[float]] = {name: [] for name in names}
    redis_pids = servers.redis.pids()
    for order in orders:
        # every contender's tokens are written before any of them runs
        batches = {name: tokens_for(name, config.direct_ops) for name in order}
        for name in order:
            tokens = batches[name]
            run = contenders[name]
            cpu_before = time.process_time() + cpu_seconds_precise(redis_pids)
            started = time.perf_counter()
            run(tokens)
            rates[name].append(len(tokens) / (time.perf_counter() - started))
            cpu = time.process_time() + cpu_seconds_precise(redis_pids) - cpu_before
            cpu_us[name].append(cpu * 1e6 / len(tokens))
    client.close()
    raw_rates, raw_cpu = rates[RAW_EVALSHA], cpu_us[RAW_EVALSHA]
    round_ratios = {
        name: [rate / raw for rate, raw in zip(values, raw_rates, strict=True)]
        for name, values in rates.items()
    }
    round_cpu_ratios = {
        name: [raw / cpu for cpu, raw in zip(values, raw_cpu, strict=True)] for name, values in cpu_us.items()
    }
    baseline = statistics.median(raw_rates)
    baseline_cpu = statistics.median(raw_cpu)
    return {
        "ops_per_round": config.direct_ops,
        "rounds": config.direct_rounds,
        "seed": config.direct_seed,
        "orders": orders,
        "ops_per_second": {name: statistics.median(values) for name, values in rates.items()},
        # median over rounds of (contender / raw EVALSHA in the same round)
        "ratios": {name: statistics.median(values) for name, values in round_ratios.items()},
        "ratio_quartiles": {name: _quartiles(values) for name, values in round_ratios.items()},
        "ratios_of_medians": {name: statistics.median(values) / baseline for name, values in rates.items()},
        "all_ops_per_second": {name: [round(v) for v in values] for name, values in rates.items()},
        "round_ratios": {name: [round(v, 3) for v in values] for name, values in round_ratios.items()},
        "cpu_us_per_op": {name: statistics.median(values) for name, values in cpu_us.items()},
        "all_cpu_us_per_op": {name: [round(v, 1) for v in values] for name, values in cpu_us.items()},
        "cpu_ratios": {name: statistics.median(values) for name, values in round_cpu_ratios.items()},
        "cpu_ratios_of_medians": {
            name: baseline_cpu / statistics.median(values) for name, values in cpu_us.items()
        },
    }


RAW_EVALSHA = "redis-py EVALSHA"


def direct_orders(names: list[str], rounds: int, seed: int) -> list[list[str]]:
    """The contenders' order in each round: every permutation once per block, blocks shuffled.

    With three contenders each runs first, second and third in two of every six rounds.
    """
    rng = random.Random(seed)
    permutations = [list(p) for p in itertools.permutations(names)]
    orders: list[list[str]] = []
    while len(orders) < rounds:
        block = [list(p) for p in permutations]
        rng.shuffle(block)
        orders += block
    return orders[:rounds]


def _quartiles(values: list[float]) -> list[float]:
    if len(values) < 2:
        return [round(values[0], 3)] * 2 if values else []
    low, _, high = statistics.quantiles(values, n=4)
    return [round(low, 3), round(high, 3)]


# -- Redis memory per outstanding token ----------------------------------------------


def memory_per_token(servers: Servers, config: Config) -> dict[str, Any]:
    """used_memory growth per ISSUED token (scope and subject set), on an empty database."""
    client = servers.redis.client()
    client.flushall()
    store = TokenStore(client)
    before = int(client.info("memory")["used_memory"])
    per_subject = 10
    subjects = config.memory_tokens // per_subject
    issued = 0
    for start in range(0, subjects, 100):
        pipe_subjects = [f"user-{n:06d}" for n in range(start, min(start + 100, subjects))]
        for subject in pipe_subjects:
            issued += len(store.issue(IssueRequest(SCOPE, subject, None, TTL_SECONDS), per_subject))
    after = int(client.info("memory")["used_memory"])
    keys = int(client.dbsize())
    client.flushall()
    per_client = limiter_memory(client, store, subjects)
    client.flushall()
    client.close()
    return {
        "per_client": per_client,
        "tokens": issued,
        "subjects": subjects,
        "scope": SCOPE,
        "subject_example": "user-000042",
        "bytes_per_token": (after - before) / issued,
        "keys": keys,
    }


def limiter_memory(client: redis.Redis, store: TokenStore, clients: int) -> dict[str, Any]:
    """The issuance limiter's record per client, with the default limits (60/minute, 100 outstanding).

    Each client is charged for 5 tokens at once: a realistic
    handful outstanding per user, all falling in one expiry bucket.
    """
    tokens_per_client = 5
    limits = IssuanceLimits(RateLimit(60, 60), 100)
    before = int(client.info("memory")["used_memory"])
    for n in range(clients):
        store.admit(
            client_key(store.key_prefix, f"addr:10.{n // 65536}.{n // 256 % 256}.{n % 256}"),
            limits,
            tokens_per_client,
            TTL_SECONDS,
        )
    grown = int(client.info("memory")["used_memory"]) - before
    return {
        "clients": clients,
        "tokens_per_client": tokens_per_client,
        "bytes_per_client": grown / clients,
        "bytes_per_token": grown / clients / tokens_per_client,
    }


# -- the Redis ceiling -----------------------------------------------------------


def app_cpu(config: Config) -> dict[str, Any]:
    """CPU per request of the two WSGI apps called in process (``benchmarks.app_cpu``).

    A child process: it configures metrics and logging as a gunicorn worker
    would, which must not leak into this one.
    """
    requests, rounds = (50, 1) if config.quick else (config.app_cpu_requests, config.rounds)
    command = [sys.executable, "-m", "benchmarks.app_cpu", "--json"]
    command += ["--requests", str(requests), "--rounds", str(rounds)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"benchmarks.app_cpu failed:\n{done.stderr[-3000:]}")
    return {"requests_per_round": requests, "rounds": rounds, "endpoints": json.loads(done.stdout)}


def redis_ceiling(servers: Servers, config: Config) -> list[dict[str, Any]]:
    binary = require("redis-benchmark", "apt-get install redis-tools")
    client = servers.redis.client()
    sha = client.script_load(baseline_app.CONSUME_LUA)
    # generate's scripts with the benchmark's limits: what the limiter costs Redis
    issue_sha = client.script_load(lua_source("issue"))
    admit_issue_sha = client.script_load(admit_issue_source())
    # the service passes its own clock to the limiter; a fixed "now" costs the same
    now_ms = str(int(time.time() * 1000))
    limit_args = IssuanceLimits(RateLimit(10**9, 1), 10**9).args(1, TTL_SECONDS, now_ms)
    issue_args = [SCOPE, "user-1", "", str(TTL_SECONDS * 1000), ""]
    client.close()
    base = [
        binary,
        "-h",
        "127.0.0.1",
        "-p",
        str(servers.redis.port),
        "-n",
        str(config.redis_benchmark_requests),
    ]
    base += ["-c", "50", "-r", "1000000", "--csv"]
    runs = [
        ("SET, 50 clients", ["-t", "set"]),
        ("GET, 50 clients", ["-t", "get"]),
        ("SET, 50 clients, pipeline 16", ["-t", "set", "-P", "16"]),
        ("EVALSHA consume-like Lua, 50 clients", ["evalsha", sha, "1", "bl:__rand_int__", SCOPE]),
        (
            "EVALSHA issue.lua (generate, no limits), 50 clients",
            ["evalsha", issue_sha, "1", "ts:t:__rand_int__", *issue_args],
        ),
        (
            "EVALSHA admit+issue (generate with limits), 50 clients",
            [
                "evalsha",
                admit_issue_sha,
                "3",
                "ts:t:__rand_int__",
                "ts:{l}:bench",
                "ts:{l}:anonymous",
                *issue_args,
                *limit_args,
            ],
        ),
    ]
    results = []
    for label, extra in runs:
        done = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=300, check=True)
        rows = [line.split('","') for line in done.stdout.strip().splitlines()[1:]]
        rps = float(rows[-1][1])
        p50 = float(rows[-1][4])
        p99 = float(rows[-1][6])
        results.append({"test": label, "rps": rps, "p50_ms": p50, "p99_ms": p99})
    return results
