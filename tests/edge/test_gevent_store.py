"""The store's connection handling holds when many greenlets share one store (gevent workers).

Under gunicorn's gevent workers every request of a worker process is a
greenlet, and they all share the process's one ``TokenStore``: the parked
connection (one per store, taken with ``list.pop``), the pool behind it, and
the rule that a call interrupted between send and read drops its
connection. This runs in a child process (gevent's monkey-patching must not
touch the test runner) against a real redis-server: hundreds of greenlets
issue, inspect and consume tokens whose replies say whose they are, some of
them interrupted at random by gevent timeouts and kills, and every reply
must belong to the call that read it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.processes import REPO_ROOT, RedisServer
from token_service import defaults
from token_service import store as store_module

pytestmark = [pytest.mark.real, pytest.mark.slow]

SCRIPT = r"""
from gevent import monkey

monkey.patch_all()

import json
import random
import sys

import gevent

from token_service.config import Settings
from token_service.connection import redis_client
from token_service.store import TokenStore
from token_service.records import IssueRequest, UseRequest

GREENLETS, ROUNDS = 300, 12
store = TokenStore(redis_client(Settings.from_mapping({"redis_url": sys.argv[1]})))
random.seed(12)
tally = {"rounds": 0, "interrupted": 0, "killed": 0, "wrong": [], "errors": []}


def one_round(i, r):
    scope, subject = f"scope.{i % 7}", f"s-{i}-{r}"
    token = store.issue(IssueRequest(scope, subject, None, 60))[0]
    seen = store.inspect(token)
    if (seen.state, seen.scope, seen.subject) != ("ISSUED", scope, subject):
        tally["wrong"].append(["inspect", subject, seen.state, seen.scope, seen.subject])
    use = UseRequest(token, scope, subject, None, f"req-{i}-{r}")
    first = store.consume(use)
    again = store.consume(use)
    if first.replayed or not again.replayed:
        tally["wrong"].append(["consume", subject, first.replayed, again.replayed])
    if store.inspect(token).state != "CONSUMED":
        tally["wrong"].append(["state", subject])


def worker(i):
    for r in range(ROUNDS):
        # one round in six gets a deadline short enough to strike mid-call
        deadline = random.choice([None] * 5 + [random.uniform(0.00005, 0.002)])
        try:
            with gevent.Timeout(deadline):
                one_round(i, r)
            tally["rounds"] += 1
        except gevent.Timeout:
            tally["interrupted"] += 1
        except Exception as exc:
            tally["errors"].append(repr(exc))
        gevent.sleep(0)


def killer(greenlets):
    # greenlet.kill raises GreenletExit wherever the victim waits: another kind of interrupt
    for _ in range(40):
        gevent.sleep(random.uniform(0.001, 0.01))
        victim = random.choice(greenlets)
        if not victim.dead:
            victim.kill(block=False)
            tally["killed"] += 1


greenlets = [gevent.spawn(worker, i) for i in range(GREENLETS)]
gevent.spawn(killer, greenlets).join()
gevent.joinall(greenlets)
# afterwards, one caller: every reply must still be its own
for r in range(50):
    one_round(-1, r)
    tally["rounds"] += 1
pool = store.client.connection_pool
tally["parked"] = len(store._parked)
tally["in_use"] = pool.in_use_count()
tally["created"] = pool._created_connections
print(json.dumps(tally))
"""


def test_many_greenlets_share_one_store_without_reply_mixups(redis_server: RedisServer) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, redis_server.url],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO_ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    tally = json.loads(done.stdout.strip().splitlines()[-1])
    assert tally["wrong"] == []
    assert tally["errors"] == []
    # the interrupts happened, and most rounds ran to the end
    assert tally["interrupted"] > 0
    assert tally["killed"] > 0
    assert tally["rounds"] >= 50
    # a few connections are parked (one per call that was in flight at once); every other one
    # went back to the pool (none leaked)
    assert 1 <= tally["parked"] <= store_module._MAX_PARKED
    assert tally["in_use"] == tally["parked"]
    # and no more were opened than the pool's bound (TOKEN_SERVICE_REDIS_MAX_CONNECTIONS), though
    # 300 greenlets called at once
    assert tally["created"] <= defaults.REDIS_MAX_CONNECTIONS
