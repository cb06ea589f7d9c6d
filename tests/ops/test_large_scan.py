"""Listing on a large Redis: 1M records walked by the admin without holding Redis for long.

A redis-server of the test's own gets 1,000,000 token records (loaded by a Lua loop,
10k per call). Then the admin walks all of them for the stuck PROCESSING ones, as
``admin list`` and the reconciler do, while SLOWLOG records every command over 1 ms
and a second client PINGs Redis all along. The yardstick is measured in the same run
on the same server: one ``KEYS`` over the same keyspace, the single call a naive tool
would make. The walk's commands cost, on average, a small fraction of it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.processes import RedisServer
from token_service.admin import TOKEN, Admin, Filter

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


class Pinger:
    """PINGs Redis from another connection all along; the slowest answer is how long a client waited."""

    def __init__(self, server: RedisServer) -> None:
        self.client = server.client()
        self.slowest = 0.0
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            self.client.ping()
            self.slowest = max(self.slowest, time.perf_counter() - started)
            self.count += 1
            time.sleep(0.001)

    def __enter__(self) -> Pinger:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(10)
        self.client.close()


def _slow_commands(client: Any) -> list[tuple[str, int]]:
    """(command, microseconds) of every SLOWLOG entry."""
    return [
        (entry["command"].split(b" ")[0].decode().upper(), int(entry["duration"]))
        for entry in client.slowlog_get(100_000)
    ]


def _per_call_us(client: Any, command: str) -> float:
    stats = client.info("commandstats").get(f"cmdstat_{command}")
    return float(stats["usec_per_call"]) if stats else 0.0


@pytest.mark.slow
def test_walking_a_million_records_never_holds_redis_for_long(large_redis: RedisServer) -> None:
    with large_redis.client() as client:
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
        scan_us, read_us = _per_call_us(client, "scan"), _per_call_us(client, "evalsha")
        scans = int(client.info("commandstats")["cmdstat_scan"]["calls"])
        client.slowlog_reset()
        client.config_resetstat()
        client.keys("ts:t:*")  # the one call a naive tool would make, on the same server, for scale
        keys_us = _per_call_us(client, "keys")

    assert len(stuck) == RECORDS // STUCK_EVERY
    assert {record.request_id for record in stuck} == {
        f"order-{i}" for i in range(STUCK_EVERY, RECORDS + 1, STUCK_EVERY)
    }
    over_5ms = [us for _, us in admin_slow if us > 5000]
    print(
        f"\n1M records, one walk: {walk_seconds:.1f} s, {scans} SCAN calls (COUNT 1000) in {steps} pages; "
        f"mean SCAN {scan_us:.0f} us, mean per-record read (EVALSHA) {read_us:.1f} us; "
        f"commands over 1 ms: {len(admin_slow)} (over 5 ms: {len(over_5ms)}, slowest "
        f"{max((us for _, us in admin_slow), default=0) / 1000:.1f} ms); slowest PING meanwhile "
        f"{pinger.slowest * 1000:.1f} ms over {pinger.count}; "
        f"KEYS on the same keyspace {keys_us / 1000:.0f} ms"
    )
    # Each step is bounded work: a SCAN of ~1000 keys, then one-key reads. A loaded machine may
    # stall any single command, so the yardstick is the mean, against KEYS on the same server.
    assert scans >= RECORDS // 1000
    assert scan_us * 50 < keys_us
    assert read_us * 1000 < keys_us
    # Nothing else ran meanwhile but the pinger's PINGs (slow only when the machine stalls Redis).
    assert {command for command, _ in admin_slow} <= {"SCAN", "EVALSHA", "GET", "PTTL", "TIME", "PING"}
