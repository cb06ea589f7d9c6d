"""Connections spread over gevent workers (token_service/server/accepts.py): nothing refused or lost.

The table's bookkeeping, then a gevent server in a child process (gevent's
monkey-patching must not touch the test runner) whose worker is the busiest:
it defers the accept once and then takes the connection itself, and counts
it while it is open. Then gunicorn with two workers, as shipped: every one
of several keep-alive connections opened at once is served, again and
again, and the workers hold them all.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT, Gunicorn, RedisServer, children, wait_until
from tests.support.raw_http import connect, read_reply, request_bytes
from tests.support.service import API_KEY
from token_service.server.accepts import FREE, Table


def test_claim_gives_a_slot_no_live_worker_holds_and_release_frees_it() -> None:
    table = Table(slots=3)
    assert table.claim([]) == 0
    assert table.claim([0, None]) == 1
    assert table.claim([0, 1]) == 2
    assert table.claim([0, 1, 2]) is None  # more workers than slots: they accept as gunicorn does
    table.counts[1] = 5
    table.release(1)
    assert table.counts[1] == FREE
    table.release(None)


def test_a_worker_defers_only_to_one_holding_fewer_connections() -> None:
    table = Table(slots=4)
    table.counts[0], table.counts[1] = 3, 3
    assert not table.others_less_busy(0)  # equal: accept at once
    table.counts[1] = 2
    assert table.others_less_busy(0)
    assert not table.others_less_busy(1)
    table.counts[1] = FREE  # a slot whose worker stopped accepting is never waited for
    assert not table.others_less_busy(0)


CHILD = r"""
from gevent import monkey

monkey.patch_all()

import json
import socket
import sys

import gevent
from gevent.pool import Pool
from gunicorn.workers import ggevent

from token_service.server import accepts

table = accepts.Table(slots=2)
held = []


class Worker:
    def handle(self, listener, client, addr):
        held.append(table.counts[0])
        client.sendall(b"hello")
        client.recv(1)  # until the client closes


worker = Worker()
accepts.install(worker, table, 0)
deferred = []
original = ggevent.StreamServer.stop_accepting


def stop_accepting(self):
    deferred.append(self._deferred)
    original(self)


ggevent.StreamServer.stop_accepting = stop_accepting
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(8)
server = ggevent.StreamServer(
    listener, handle=lambda client, addr: worker.handle(listener, client, addr), spawn=Pool(10)
)
server.max_accept = 1
server.start()
started = table.counts[0]
table.counts[1] = 0  # another worker holds no connection ...
table.counts[0] = 1  # ... and this one holds one: it is the busier
client = socket.create_connection(listener.getsockname())
greeting = client.recv(5)  # served all the same, after the deferral
during = table.counts[0]
client.close()
while table.counts[0] != 1:
    gevent.sleep(0.01)
server.close()
closed = table.counts[0] == accepts.FREE
print(json.dumps({"started": started, "greeting": greeting.decode(), "held": held,
                  "during": during, "deferrals": deferred.count(True), "closed": closed}))
"""


def test_the_busier_worker_defers_once_then_accepts_and_counts_the_connection() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, check=False
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["started"] == 0  # a started server publishes its slot
    assert result["greeting"] == "hello"
    assert result["held"] == [2]  # counted while handled: the one it held plus this one
    assert result["during"] == 2
    assert result["deferrals"] == 1  # it waited once for the less busy worker, which never came
    assert result["closed"]  # closing the server frees the slot: nobody waits for it


@pytest.fixture(scope="module")
def two_workers() -> Iterator[Gunicorn]:
    redis_server = RedisServer().start()
    server = Gunicorn({"TOKEN_SERVICE_REDIS_URL": redis_server.url, "TOKEN_SERVICE_API_KEYS": API_KEY})
    try:
        yield server.start()
    finally:
        server.stop()
        redis_server.stop()


def _worker_connections(server: Gunicorn) -> dict[int, int]:
    """Established connections to the server's port held by each worker (from /proc)."""
    assert server.process is not None
    master = server.process.pid
    workers = children(master)
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].rsplit(":", 1)[1], 16)
        if local_port == server.port and fields[3] == "01":  # ESTABLISHED
            inodes.add(fields[9])
    held = {}
    for pid in workers:
        count = 0
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = fd.readlink()
            except OSError:
                continue
            if str(target).startswith("socket:[") and str(target)[8:-1] in inodes:
                count += 1
        held[pid] = count
    return held


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads /proc")
def test_keep_alive_connections_opened_at_once_are_all_served(two_workers: Gunicorn) -> None:
    address = ("127.0.0.1", two_workers.port)
    connections: list[socket.socket] = [connect(address) for _ in range(8)]
    try:
        for _ in range(3):
            for sock in connections:
                sock.sendall(request_bytes("GET", "/healthz"))
            for sock in connections:
                assert read_reply(sock).status == 200
        wait_until(
            lambda: sum(_worker_connections(two_workers).values()) == 8, timeout_seconds=30, what="8 held"
        )
    finally:
        for sock in connections:
            sock.close()
