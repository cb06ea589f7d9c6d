"""Listing on a large Redis: 1M records walked by the admin without holding Redis for long.

A redis-server of the test's own gets 1,000,000 token records (loaded by a Lua loop,
10k per call). Then the admin walks all of them for the stuck PROCESSING ones, as
``admin list`` and the reconciler do. What each command cost is Redis's own measure
(``INFO latencystats``: the p50, p99, p99.9 and slowest of every SCAN and every
record read) and SLOWLOG lists every command over 1 ms; another process PINGs Redis
all along and reports how long it waited. The yardstick is measured in the same run
on the same server: one ``KEYS`` over the same keyspace, the single call a naive tool
would make. A loaded machine can stall any one command (Redis descheduled), so the
checks hold the percentiles to the yardstick, never a wall-clock figure.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.processes import RedisServer
from token_service.ops.admin import TOKEN, Admin, Filter

RECORDS = 1_000_000
PER_CALL = 10_000  # each loading call stays far below Lua's 5 s busy limit, even on a loaded machine
STUCK_EVERY = 10_000  # one PROCESSING record with a run-out lease per 10k

LOAD = """
local first, last, stuck_every = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local sep = '\\31'
for i = first, last do
  local key = 'ts:t:' .. string.format('%022x', i)
  local value
  if i % stuck_every == 0 then
    -- PROCESSING: scope, subject, fingerprint, request id, lease id, lease expiry (1 ms
    -- after the epoch: long run out), the token's own expiry (far ahead)
    value = 'Pcheckout' .. sep .. 'user-' .. i .. sep .. sep .. 'order-' .. i .. sep .. 'lease' .. sep
      .. '1' .. sep .. '99999999999999'
  elseif i % 3 == 0 then
    value = 'Ccheckout' .. sep .. 'user-' .. i .. sep .. sep .. 'req-' .. i
  else
    value = 'Icheckout' .. sep .. 'user-' .. i
  end
  redis.call('SET', key, value, 'PX', 3600000)
end
return last - first + 1
"""


@pytest.fixture(scope="module")
def large_redis() -> Iterator[RedisServer]:
    server = RedisServer("--save", "", "--appendonly", "no").start()
    with server.client() as client:
        load = client.register_script(LOAD)
        for first in range(1, RECORDS + 1, PER_CALL):
            load(args=[first, first + PER_CALL - 1, STUCK_EVERY])
        assert client.dbsize() == RECORDS
    yield server
    server.stop()


# Another process (not a thread beside the walk: the GIL would be what it measured) PINGs Redis
# once a millisecond until its stdin closes, then prints its waits' percentiles (ms).
PINGER = """
import json, select, sys, time
import redis
client = redis.Redis(port=int(sys.argv[1]))
waits = []
while not select.select([sys.stdin], [], [], 0.001)[0]:
    started = time.perf_counter()
    client.ping()
    waits.append(time.perf_counter() - started)
waits.sort()
def at(q):
    return round(waits[min(len(waits) - 1, int(len(waits) * q))] * 1000, 2)
print(json.dumps({"pings": len(waits), "p50": at(0.5), "p99": at(0.99), "max": at(1.0)}))
"""


class Pinger:
    def __init__(self, server: RedisServer) -> None:
        self.port = server.port
        self.figures: dict[str, Any] = {}

    def __enter__(self) -> Pinger:
        self.process = subprocess.Popen(
            [sys.executable, "-c", PINGER, str(self.port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        return self

    def __exit__(self, *exc: Any) -> None:
        out, _ = self.process.communicate("stop\n", timeout=60)
        self.figures = json.loads(out)


def _slow_commands(client: Any) -> list[tuple[str, int]]:
    """(command, microseconds) of every SLOWLOG entry."""
    return [
        (entry["command"].split(b" ")[0].decode().upper(), int(entry["duration"]))
        for entry in client.slowlog_get(100_000)
    ]


def _latency_us(client: Any, command: str) -> dict[str, float]:
    """Redis's own percentiles of ``command`` since the last CONFIG RESETSTAT: p50, p99, p99.9, p100."""
    return {
        name: float(value)
        for name, value in client.info("latencystats")[f"latency_percentiles_usec_{command}"].items()
    }


def _calls(client: Any, command: str) -> int:
    return int(client.info("commandstats")[f"cmdstat_{command}"]["calls"])


@pytest.mark.slow
def test_walking_a_million_records_never_holds_redis_for_long(large_redis: RedisServer) -> None:
    with large_redis.client() as client:
        if int(client.info("server")["redis_version"].split(".")[0]) < 7:
            pytest.skip("INFO latencystats needs Redis 7")
        client.config_set("latency-tracking-info-percentiles", "50 99 99.9 100")
        client.config_set("slowlog-max-len", 100_000)
        client.config_set("slowlog-log-slower-than", 1000)  # every command over 1 ms
        client.slowlog_reset()
        client.config_resetstat()
        admin = Admin(large_redis.client(), actor="test")

        with Pinger(large_redis) as pinger:
            started = time.perf_counter()
            steps, cursor, stuck = 0, "0", []
            while True:  # what `token-service admin list --state PROCESSING` and the reconciler walk do
                page = admin.list(
                    Filter(kind=TOKEN, state="PROCESSING", lease_expired=True), cursor, count=1000
                )
                steps += 1
                stuck += page.records
                if page.done:
                    break
                cursor = page.cursor
            walk_seconds = time.perf_counter() - started
        admin.client.close()

        admin_slow = _slow_commands(client)
        scan, read = _latency_us(client, "scan"), _latency_us(client, "evalsha")
        scans, reads = _calls(client, "scan"), _calls(client, "evalsha")
        client.slowlog_reset()
        client.config_resetstat()
        client.keys("ts:t:*")  # the one call a naive tool would make, on the same server, for scale
        # commandstats, not latencystats: its histogram stops at 1 s, and KEYS can take longer
        keys_us = float(client.info("commandstats")["cmdstat_keys"]["usec"])

    assert len(stuck) == RECORDS // STUCK_EVERY
    assert {record.request_id for record in stuck} == {
        f"order-{i}" for i in range(STUCK_EVERY, RECORDS + 1, STUCK_EVERY)
    }
    over_5ms = [us for _, us in admin_slow if us > 5000]
    pings = pinger.figures
    print(
        f"\n1M records, one walk: {walk_seconds:.1f} s, {scans} SCAN calls (COUNT 1000) in {steps} pages, "
        f"{reads} record reads (EVALSHA); "
        f"SCAN p50 {scan['p50'] / 1000:.2f} ms, p99 {scan['p99'] / 1000:.2f} ms, "
        f"p99.9 {scan['p99.9'] / 1000:.2f} ms, slowest {scan['p100'] / 1000:.1f} ms; "
        f"read p50 {read['p50']:.0f} us, p99 {read['p99']:.0f} us, slowest {read['p100'] / 1000:.1f} ms; "
        f"commands over 1 ms: {len(admin_slow)} (over 5 ms: {len(over_5ms)}); "
        f"another process's PING waited p50 {pings['p50']} ms, p99 {pings['p99']} ms, "
        f"slowest {pings['max']} ms over {pings['pings']}; "
        f"KEYS on the same keyspace {keys_us / 1000:.0f} ms"
    )
    # Each step is bounded work: a SCAN of ~1000 keys, then one-key reads (pipelined: Redis
    # serves other clients between the chunks it reads). Held to the yardstick, not the clock.
    assert scans >= RECORDS // 1000
    assert reads >= RECORDS
    assert scan["p50"] * 100 < keys_us
    assert scan["p99"] * 20 < keys_us
    assert read["p99"] * 1000 < keys_us
    # Nothing else ran meanwhile but the pinger's PINGs (slow only when the machine stalls Redis).
    assert {command for command, _ in admin_slow} <= {"SCAN", "EVALSHA", "GET", "PTTL", "TIME", "PING"}
