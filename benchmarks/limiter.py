"""What generate and consume cost Redis, with the issuance limiter on: the Redis-side budget.

    python -m benchmarks.limiter                 # ~1 min; prints a Markdown table
    python -m benchmarks.limiter --quick         # seconds: checks the harness only
    python -m benchmarks.limiter --instructions  # ~1 min: instructions per request (valgrind)

One private redis-server (free port, no persistence), driven by
``redis-benchmark`` (50 clients, no pipelining), runs in rounds, A B A B:

- ``SET EX``: a key and value the size of a token record, the baseline of generate;
- generate: the store's combined admit+issue script (one EVALSHA) for one client
  whose limits are raised so that every call is admitted, charged and counted
  (a rate limit, an outstanding cap, the token counted in a bucket);
- a minimal GET/SET Lua script (the benchmark's hand-written consume), the
  baseline of consume;
- consume: ``lua/consume.lua`` on tokens counted by that client, so each consume
  also takes its token out of the client's bucket (the release, KEYS[2]).

Every row that writes token records writes new keys (its own key pattern, drawn
from 10^11 numbers): a generate always creates its record, and a row that met
keys an earlier row had written would be charged less (``NX`` refused, no new
key, no expiry entry).

``--instructions`` runs the same rows (and generate as a Redis Function) once
against a redis-server under valgrind's callgrind and counts the instructions
it executes per request: figures that do not move with the machine's load, for
comparing two versions of a script on a shared machine.

Per row: requests per second (redis-benchmark) and Redis CPU per request
(``INFO cpu``, user + system, over the run). The budget: generate at ≥ 0.67x the
rate of ``SET EX`` (Redis CPU ≤ 1.5x), consume at ≥ 0.8x the GET/SET Lua. Each
ratio is taken within a round, then the median over rounds. Consume keys are
drawn at random from a pre-filled keyspace, as the baseline's are, so both meet
the same share of already-used keys.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from benchmarks.baseline_app import CONSUME_LUA
from benchmarks.procs import CallgrindRedis, RedisServer, require
from benchmarks.report import replace_section
from token_service.config import RateLimit
from token_service.limits import IssuanceLimits
from token_service.scripts import admit_issue_source, lua_source

SCOPE = "payment.create"
TTL_SECONDS = 900
ISSUE_ARGS = [SCOPE, "user-1", "", str(TTL_SECONDS * 1000), ""]
CLIENT = "ts:c:bench"
# the anonymous budget's record: named (the generate script takes it last), not asked for here
BUDGET = "ts:c:budget"
# redis-benchmark replaces __rand_int__ with 12 digits: "ts:t:" + 12 + 10 = 27 chars,
# the length of a real record key ("ts:t:" + 22 digest characters); each row its own
# last 10 characters, so that no row meets another's keys
TOKEN_KEY = "ts:t:__rand_int__{row:0>10}"  # noqa: S105 (a key name)
# the numbers token keys are drawn from: 100 000 draws meet an earlier key about once in 20
FRESH_KEYSPACE = 10**11
BUCKET = "4000000000"  # a bucket end far in the future, where every benchmark token is counted
RECORD = f"I{SCOPE}\x1f\x1f\x1f\x1f\x1f{BUCKET}"  # an ISSUED record counted in BUCKET
# the least any Lua generate does: one SET of the token record, nothing else
FLOOR_LUA = "return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[4], 'NX')"
# a script with generate's keys and arguments that calls nothing: what EVALSHA itself costs
# (the keys and arguments are pushed into Lua on every call, about 1 300 instructions each)
EMPTY_LUA = "return {'issued'}"
# the least a limiter that keeps its state in one client record (as admit.lua does) adds to it:
# read the record, write it back with an expiry; no arithmetic, no argument checks. Called
# with generate's own keys and arguments, so that only the Lua between the calls differs.
LIMITER_FLOOR_LUA = """
local limits = redis.call('GET', KEYS[2])
redis.call('SET', KEYS[2], limits or '', 'PX', ARGV[4])
return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[4], 'NX')
"""
# the least a consume that releases its token from the client record (as consume.lua does)
# can do: the token's GET and SET, the client record's GET and SET; consume's keys and arguments
CONSUME_FLOOR_LUA = """
local v = redis.call('GET', KEYS[1])
if not v then return {'invalid'} end
if string.byte(v) ~= 73 then return {'token_used'} end
redis.call('SET', KEYS[1], 'C', 'KEEPTTL')
local limits = redis.call('GET', KEYS[2])
redis.call('SET', KEYS[2], limits or '', 'KEEPTTL')
return {'consumed'}
"""
FILL_LUA = """
for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
  redis.call('SET', string.format(ARGV[3], i), ARGV[4], 'PX', 900000)
end
return 1
"""


SET_EX = "SET EX (token-record size)"
ONE_SET = "Lua: one SET PX NX (the floor of any script)"
EMPTY = "Lua: generate's keys and arguments, no Redis call (EVALSHA's own cost)"
LIMITER_FLOOR = "Lua: generate's arguments, GET + SET PX of a client record, SET PX NX (a limiter's floor)"
ISSUE = "issue.lua (generate, limits off)"
GENERATE = "generate: admit+issue, limits on"
GET_SET = "GET/SET Lua (minimal consume)"
CONSUME = "consume.lua, releasing a counted token"
CONSUME_FLOOR = "Lua: consume's arguments, GET + SET of the token and of its client record (its floor)"


@dataclass
class Config:
    quick: bool = False
    rounds: int = 5
    requests: int = 100_000
    keyspace: int = 200_000

    @classmethod
    def quick_mode(cls) -> Config:
        return cls(quick=True, rounds=1, requests=2000, keyspace=4000)


def _cpu_seconds(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _fill(client: redis.Redis, pattern: str, value: str, keyspace: int) -> None:
    fill = client.register_script(FILL_LUA)
    for start in range(0, keyspace, 2000):  # short script runs: valgrind slows them 50x (--instructions)
        fill(args=[start, min(start + 2000, keyspace) - 1, pattern, value])


def _rows(client: redis.Redis, keyspace: int) -> dict[str, list[str]]:
    """Each row's redis-benchmark arguments (``-r`` and the command), its scripts loaded into ``client``."""
    generate_sha = client.script_load(admit_issue_source())
    consume_sha = client.script_load(lua_source("consume"))
    baseline_sha = client.script_load(CONSUME_LUA)
    issue_sha = client.script_load(lua_source("issue"))
    floor_sha = client.script_load(FLOOR_LUA)
    limiter_floor_sha = client.script_load(LIMITER_FLOOR_LUA)
    empty_sha = client.script_load(EMPTY_LUA)
    consume_floor_sha = client.script_load(CONSUME_FLOOR_LUA)
    fresh = ["-r", str(FRESH_KEYSPACE)]
    filled = ["-r", str(keyspace)]
    return {
        SET_EX: [*fresh, "set", TOKEN_KEY.format(row="set"), RECORD, "EX", str(TTL_SECONDS)],
        ONE_SET: [*fresh, "evalsha", floor_sha, "1", TOKEN_KEY.format(row="floor"), *ISSUE_ARGS],
        EMPTY: [*fresh, "evalsha", empty_sha, "2", TOKEN_KEY.format(row="empty"), CLIENT, *_generate_args()],
        LIMITER_FLOOR: [
            *fresh,
            "evalsha",
            limiter_floor_sha,
            "2",
            TOKEN_KEY.format(row="limfloor"),
            CLIENT,
            *_generate_args(),
        ],
        ISSUE: [*fresh, "evalsha", issue_sha, "1", TOKEN_KEY.format(row="issue"), *ISSUE_ARGS],
        GENERATE: [
            *fresh,
            "evalsha",
            generate_sha,
            "3",
            TOKEN_KEY.format(row="generate"),
            CLIENT,
            BUDGET,
            *_generate_args(),
        ],
        GET_SET: [*filled, "evalsha", baseline_sha, "1", "bl:__rand_int__", SCOPE],
        CONSUME: [*filled, "evalsha", consume_sha, "2", "ct:__rand_int__", CLIENT, SCOPE, "", "", "rid", ""],
        CONSUME_FLOOR: [
            *filled,
            "evalsha",
            consume_floor_sha,
            "2",
            "cf:__rand_int__",
            CLIENT,
            SCOPE,
            "",
            "",
            "rid",
            "",
        ],
    }


def _generate_args() -> list[str]:
    # Limits every call passes: the cap above the 10^12 tokens _prepare counts in BUCKET, and
    # a rate whose period outlasts any run. (The limiter's clock has whole milliseconds: each
    # admitted call moves the client's theoretical arrival time on by at least 1 ms, so with
    # a fixed "now" a period of 1 s refuses every call after the first thousand. Until this
    # was seen, the cap was 10^9 and every generate of the row was a cheap refusal.)
    limits = IssuanceLimits(RateLimit(10**9, 10**6), 10**13)
    # the service passes its own clock to the limiter (no TIME call in the script); a fixed
    # "now" here costs the same and keeps every call in one bucket, as a steady client is
    return [*ISSUE_ARGS, *limits.args(1, TTL_SECONDS, str(int(time.time() * 1000)))]


def _check_generate_admits(client: redis.Redis) -> None:
    """The generate row measures what it says: a call admitted, charged, counted and issued."""
    reply = client.eval(admit_issue_source(), 3, "ts:t:check", CLIENT, BUDGET, *_generate_args())
    if reply != [b"issued"]:
        raise RuntimeError(f"the generate row would not measure an issued token: {reply!r}")
    client.delete("ts:t:check")


def _prepare(client: redis.Redis, keyspace: int) -> None:
    client.flushall()
    client.set(CLIENT, f"|{BUCKET}:{10**12}")
    _fill(client, "bl:%012d", SCOPE, keyspace)
    _fill(client, "ct:%012d", RECORD, keyspace)
    _fill(client, "cf:%012d", RECORD, keyspace)


def run(config: Config) -> dict[str, Any]:
    binary = require("redis-benchmark", "apt-get install redis-tools")
    server = RedisServer().start()
    try:
        client = server.client()
        base = [binary, "-h", "127.0.0.1", "-p", str(server.port), "-n", str(config.requests)]
        base += ["-c", "50", "--csv"]
        runs = _rows(client, config.keyspace)
        rounds: list[dict[str, dict[str, float]]] = []
        for number in range(config.rounds):
            _prepare(client, config.keyspace)
            order = list(runs) if number % 2 == 0 else list(reversed(runs))
            measured: dict[str, dict[str, float]] = {}
            for label in order:
                client.config_resetstat()
                before = _cpu_seconds(client)
                done = subprocess.run(
                    [*base, *runs[label]], capture_output=True, text=True, timeout=600, check=True
                )
                cpu = _cpu_seconds(client) - before
                row = done.stdout.strip().splitlines()[-1].strip('"').split('","')
                stats = client.info("commandstats")["cmdstat_" + runs[label][2]]
                measured[label] = {
                    "rps": float(row[1]),
                    "cpu_us": cpu / config.requests * 1e6,
                    "exec_us": float(stats["usec_per_call"]),
                }
            _check_generate_admits(client)  # after all of the round's calls, still admitted
            rounds.append(measured)
        client.close()
    finally:
        server.stop()
    labels = list(runs)

    def ratio(a: str, b: str, key: str) -> float:
        return statistics.median(r[a][key] / r[b][key] for r in rounds)

    return {
        "rounds": rounds,
        "medians": {
            label: {
                key: statistics.median(r[label][key] for r in rounds) for key in ("rps", "cpu_us", "exec_us")
            }
            for label in labels
        },
        "budgets": {
            "generate rate / SET EX rate (>= 0.67)": ratio(GENERATE, SET_EX, "rps"),
            "generate Redis CPU / SET EX CPU (<= 1.5)": ratio(GENERATE, SET_EX, "cpu_us"),
            "consume rate / GET-SET Lua rate (>= 0.8)": ratio(CONSUME, GET_SET, "rps"),
            "consume Redis CPU / GET-SET Lua CPU (<= 1.25)": ratio(CONSUME, GET_SET, "cpu_us"),
        },
        "context": {
            "one-SET Lua script CPU / SET EX CPU": ratio(ONE_SET, SET_EX, "cpu_us"),
            "generate's arguments, no call: CPU / SET EX CPU": ratio(EMPTY, SET_EX, "cpu_us"),
            "generate's arguments, GET + SET + SET (the limiter's floor): CPU / SET EX CPU": ratio(
                LIMITER_FLOOR, SET_EX, "cpu_us"
            ),
            "the limiter's floor: rate / SET EX rate": ratio(LIMITER_FLOOR, SET_EX, "rps"),
            "consume's floor (GET + SET + GET + SET): rate / GET-SET Lua rate": ratio(
                CONSUME_FLOOR, GET_SET, "rps"
            ),
            "issue.lua CPU / SET EX CPU": ratio(ISSUE, SET_EX, "cpu_us"),
            "the limiter's own cost: admit+issue CPU / issue.lua CPU": ratio(GENERATE, ISSUE, "cpu_us"),
        },
    }


GENERATE_FCALL = "generate: the same Lua as a Redis Function (FCALL)"


def function_library() -> str:
    """The generate script as a Redis Functions library, to measure what FCALL would save.

    The helpers and the two script bodies are defined once, when the library is
    loaded, instead of on every call; KEYS and ARGV, which the bodies read as
    globals, become upvalues set on entry (a function runs alone, as a script does).
    """
    definitions, marker, main = admit_issue_source().rpartition("local refused = issue_refusal()")
    return "\n".join(
        [
            "#!lua name=ts_limiter_bench",
            "local KEYS, ARGV",
            definitions,
            "local function generate()",
            marker + main,
            "end",
            "redis.register_function('generate', function(keys, args)",
            "  KEYS, ARGV = keys, args",
            "  return generate()",
            "end)",
        ]
    )


def instructions(requests: int, keyspace: int) -> dict[str, float]:
    """redis-server's user-space instructions per request, per row (valgrind's callgrind).

    Counted, not timed: a busy machine gives the same figures as a quiet one, so
    two variants can be compared in one run. The kernel's part (socket reads and
    writes, the same for every row, most of a SET EX's CPU) is not counted: the
    ratios to SET EX are larger than the CPU ratios of :func:`run`.
    """
    binary = require("redis-benchmark", "apt-get install redis-tools")
    server = CallgrindRedis().start()
    try:
        client = server.client()
        runs = _rows(client, keyspace)
        client.function_load(function_library(), replace=True)
        runs[GENERATE_FCALL] = [*runs[GENERATE][:2], "fcall", "generate", *runs[GENERATE][4:]]
        runs[GENERATE_FCALL][5] = TOKEN_KEY.format(row="fcall")
        _prepare(client, keyspace)
        base = [binary, "-h", "127.0.0.1", "-p", str(server.port), "-c", "4"]
        counted: dict[str, float] = {}
        for label, args in runs.items():
            # a warm-up, then the counted requests
            subprocess.run([*base, "-n", "200", *args], capture_output=True, timeout=600, check=True)
            server.instructions()
            subprocess.run([*base, "-n", str(requests), *args], capture_output=True, timeout=600, check=True)
            counted[label] = server.instructions() / requests
        _check_generate_admits(client)
        client.close()
    finally:
        server.stop()
    return counted


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| run | requests/s | Redis CPU per request (µs) | of which executing the command (µs) |",
        "|---|---:|---:|---:|",
    ]
    for label, row in result["medians"].items():
        lines.append(f"| {label} | {row['rps']:,.0f} | {row['cpu_us']:.1f} | {row['exec_us']:.1f} |")
    lines += ["", "| ratio (median of per-round ratios) | value |", "|---|---:|"]
    for label, value in [*result["budgets"].items(), *result["context"].items()]:
        lines.append(f"| {label} | {value:.2f} |")
    return "\n".join(lines)


def instructions_markdown(counted: dict[str, float]) -> str:
    lines = ["| run | instructions per request | x SET EX |", "|---|---:|---:|"]
    for label, value in counted.items():
        lines.append(f"| {label} | {value:,.0f} | {value / counted[SET_EX]:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.limiter", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds: checks the harness, no figures")
    parser.add_argument("--json", action="store_true", help="print the raw result as JSON")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count redis-server's instructions per request under valgrind instead (load-independent)",
    )
    parser.add_argument(
        "--write",
        action="store_true",
        help="put the table into benchmarks/RESULTS.md (its 'limiter' section; the suite keeps it)",
    )
    options = parser.parse_args(argv)
    config = Config.quick_mode() if options.quick else Config()
    if options.rounds:
        config.rounds = options.rounds
    if options.instructions:
        counted = instructions(200 if config.quick else 3000, 20_000)
        print(json.dumps(counted, indent=2) if options.json else instructions_markdown(counted))
        return 0
    result = run(config)
    print(json.dumps(result, indent=2) if options.json else markdown(result))
    if options.write and not config.quick:
        path = Path(__file__).resolve().parent / "RESULTS.md"
        text = path.read_text()
        # the table is refreshed; the section's prose (what the figures say) is kept as written
        start = text.find("| run | requests/s | Redis CPU")
        end = text.find("\n\n", text.find("| ratio (median", start))  # after the second table
        if start != -1 and end != -1:
            path.write_text(text[:start] + markdown(result) + text[end:])
        else:
            path.write_text(
                replace_section(
                    text, "limiter", "## Issuance limiter: Redis-side cost\n\n" + markdown(result)
                )
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
