"""One renewal scheduler per process: short guarded calls cost no thread, long ones still renew.

The "no thread per call" property is held by counting objects, not time: across 200
short guarded calls (``@idempotent`` and ``client.guard(...).run``, renewal on) at most
one thread is created (the scheduler's own, the first time), no ``threading.Condition``
(nor ``Event``, which makes one) or ``weakref.finalize`` per call, and the scheduler's
thread is woken at most once (a wake-up per call is a thread switch per call). The
previous renewer built an Event, an RLock, closures and a finalizer on every call.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from typing import Any

import pytest
import redis
import redis.asyncio

from tests.support.processes import RedisServer, wait_until
from token_service.client import AsyncTokenClient, TokenClient, TokenInProgress, _renewal, guard, idempotent
from token_service.client._renewal import RenewalScheduler

SCOPE = "report.build"
CALLS = 200


class Counted:
    """Counts constructions of a class (threading.Thread, threading.Condition) while installed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> None:
        self.count = 0
        original = getattr(owner, name)
        counter = self

        class Counting(original):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                counter.count += 1
                super().__init__(*args, **kwargs)

        monkeypatch.setattr(owner, name, Counting)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, Counted]:
    return {
        "threads": Counted(monkeypatch, threading, "Thread"),
        # threading.Event builds its Condition through this module attribute too
        "conditions": Counted(monkeypatch, threading, "Condition"),
    }


@pytest.fixture
def own_scheduler(monkeypatch: pytest.MonkeyPatch) -> RenewalScheduler:
    """A scheduler of the test's own, in place of the process-wide one.

    The process-wide one carries what earlier tests in this process left on its heap: the last
    stopped entry it sleeps towards may be due later than this test's renewals (a longer lease),
    and then each of this test's calls wakes it, as its docstring says. That is the state of the
    worker, not what this test checks. (Its thread stays behind idle, a daemon.)
    """
    fresh = RenewalScheduler()
    monkeypatch.setattr(_renewal, "SCHEDULER", fresh)
    monkeypatch.setattr(guard, "SCHEDULER", fresh)
    return fresh


@pytest.mark.real
def test_short_guarded_calls_create_no_thread_condition_or_finalizer(
    real_redis: redis.Redis, own_scheduler: RenewalScheduler, counted: dict[str, Counted]
) -> None:
    scheduler = own_scheduler  # made before counted starts counting (the fixtures run in this order)
    client = TokenClient.from_redis(real_redis)
    # a long lease: no renewal falls due while this test runs, however slowly
    tokens = [issued.token for issued in client.generate_batch(SCOPE, CALLS // 2)]

    @idempotent(client, SCOPE, key="order_id", lease_seconds=600)
    def ship(order_id: str) -> dict[str, str]:
        return {"order": order_id}

    started_before, wakeups_before = scheduler.threads_started, scheduler.wakeups
    for i in range(CALLS // 2):
        assert ship(f"o-{i}") == {"order": f"o-{i}"}
    for token in tokens:
        assert client.guard(token, SCOPE, lease_seconds=600).run(lambda: 1) == 1
    # at most the scheduler's own thread (none when an earlier test started it), never one per call
    assert counted["threads"].count <= 1
    assert counted["conditions"].count <= 1  # the scheduler's, with its thread
    assert scheduler.threads_started == started_before  # no renewal ran: none was due
    # nor is the scheduler's thread woken per call: at most once, if it slept with nothing to do
    assert scheduler.wakeups - wakeups_before <= 1
    assert scheduler._thread is not None
    assert scheduler._thread.name == "token-lease-scheduler"
    assert scheduler.pending() == 0  # every call took its renewal off the schedule


@pytest.mark.real
def test_finalizers_are_not_made_per_call(real_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    client = TokenClient.from_redis(real_redis)  # its store has a finalizer of its own, once
    made: list[Any] = []
    original = weakref.finalize
    monkeypatch.setattr(weakref, "finalize", lambda *a, **k: made.append(a) or original(*a, **k))
    for issued in client.generate_batch(SCOPE, 20):
        client.guard(issued.token, SCOPE, lease_seconds=600).run(lambda: 1)
    assert made == []


def test_a_dropped_guard_stops_renewing() -> None:
    """The scheduler holds a guard weakly: collected without being settled, it is not renewed again."""
    scheduler = RenewalScheduler()
    renewed: list[int] = []

    class Holder:
        def _renew_lease(self) -> None:
            renewed.append(1)

        def _lost(self, exc: Exception) -> None:
            pass

        def _renew_failed(self, exc: Exception) -> None:
            pass

    kept = Holder()
    dropped = Holder()
    scheduler.schedule(dropped, 0.05)
    del dropped
    gc.collect()
    kept_renewal = scheduler.schedule(kept, 0.05)
    # the kept one renews; the dropped one, due first, was found gone and never ran
    wait_until(lambda: kept_renewal.renewals >= 2, 30, what="two renewals of the kept holder")
    kept_renewal.stop()
    assert len(renewed) == kept_renewal.renewals


@pytest.mark.real
@pytest.mark.slow
def test_a_long_call_still_renews_on_the_shared_scheduler(real_redis: redis.Redis) -> None:
    """A short lease, work that outlives several of them: every duplicate gets TokenInProgress, one run."""
    client = TokenClient.from_redis(real_redis)
    token = client.generate(SCOPE).token
    runs = 0
    started = threading.Event()
    release = threading.Event()
    outcome: list[Any] = []

    def work() -> str:
        nonlocal runs
        runs += 1
        started.set()
        release.wait(60)
        return "done"

    # short calls at the same time share the scheduler with the long one
    tokens = [issued.token for issued in client.generate_batch(SCOPE, 50)]
    holder = threading.Thread(
        target=lambda: outcome.append(client.guard(token, SCOPE, lease_seconds=2).run(work))
    )
    holder.start()
    assert started.wait(30)
    began = time.monotonic()
    refused = 0
    try:
        for at in (2.5, 4.5, 6.5):  # past the first 2 s lease, past two, past three
            time.sleep(max(0.0, began + at - time.monotonic()))
            for short in tokens[:10]:
                client.guard(short, SCOPE).run(lambda: 1)
            tokens = tokens[10:]
            with pytest.raises(TokenInProgress):
                client.guard(token, SCOPE, lease_seconds=2).run(work)
            refused += 1
    finally:
        release.set()
    holder.join(30)
    assert (runs, refused, outcome) == (1, 3, ["done"])
    assert client.guard(token, SCOPE).run(work) == "done"  # replayed
    assert runs == 1


@pytest.mark.real
@pytest.mark.slow
async def test_async_guards_renew_on_their_loop(redis_server: RedisServer) -> None:
    async_redis = redis.asyncio.Redis.from_url(redis_server.url)
    client = AsyncTokenClient.from_redis(async_redis)
    token = (await client.generate(SCOPE)).token
    short = [issued.token for issued in await client.generate_batch(SCOPE, 50)]
    tasks_before = len(asyncio.all_tasks())
    for each in short:
        assert await client.guard(each, SCOPE, lease_seconds=600).run(_one) == 1
    assert len(asyncio.all_tasks()) == tasks_before  # no task per call: a timer, cancelled
    release = asyncio.Event()

    async def slow() -> str:
        await asyncio.wait_for(release.wait(), 60)
        return "done"

    first = asyncio.create_task(client.guard(token, SCOPE, lease_seconds=2).run(slow))
    began = time.monotonic()
    try:
        for at in (2.5, 4.5):
            await asyncio.sleep(max(0.0, began + at - time.monotonic()))
            with pytest.raises(TokenInProgress):
                await client.guard(token, SCOPE, lease_seconds=2).run(slow)
    finally:
        release.set()
    assert await asyncio.wait_for(first, 30) == "done"
    await async_redis.aclose()


async def _one() -> int:
    return 1


def test_stopping_a_renewal_whose_thread_is_not_started_yet_returns() -> None:
    """The scheduler hands a renewal its thread before starting it (so that thread sees
    ``stopped``): a guard settling in that instant stopped with "cannot join thread before it is
    started" (a clean-clone run at load 8, tests/client/test_clock_skew.py)."""
    ran: list[bool] = []

    class Target:
        def _renew_lease(self) -> None:
            ran.append(True)

        def _lost(self, exc: Any) -> None: ...
        def _renew_failed(self, exc: Any) -> None: ...

    target = Target()
    renewal = _renewal.Renewal(target, interval_seconds=60, weak=False)
    scheduler = RenewalScheduler()
    thread = threading.Thread(target=scheduler._renew, args=(renewal,), daemon=True)
    renewal._thread = thread  # as RenewalScheduler._start does, before thread.start()
    renewal.stop(timeout_seconds=0)
    assert renewal.stopped
    thread.start()  # the thread the scheduler then starts renews nothing
    thread.join(30)
    assert not thread.is_alive()
    assert ran == []
