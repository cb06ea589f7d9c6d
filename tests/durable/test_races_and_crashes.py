"""Processes racing on one key, and processes dying inside the transaction (real servers, SQLite file)."""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa

from tests.durable.databases import Db
from tests.durable.workers import charge, die_inside_transaction, race
from tests.support.processes import wait_until
from token_service.client.durable import run_once

# fork: the children import nothing again, so six of them start in milliseconds
CTX = multiprocessing.get_context("fork")
RACERS = 6

pytestmark = pytest.mark.timeout(120)


def collect(results: Any, count: int) -> list[tuple[Any, ...]]:
    return [results.get(timeout=60) for _ in range(count)]


def join_all(processes: list[Any]) -> None:
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0, f"{process.name} exited with {process.exitcode}"


def _queued_behind_the_holder(db: Db, count: int) -> None:
    """Until ``count`` sessions wait on the holder's lock (a fixed pause may end before a loaded
    machine even started them, and "nobody got past it" would prove nothing); SQLite shows no
    waiters, so there it is the pause."""
    if db.lock_waiters() is None:
        time.sleep(0.5)
        return
    wait_until(lambda: db.lock_waiters() == count, what=f"{count} sessions waiting on the holder's lock")


@pytest.mark.slow
def test_processes_racing_on_one_key_run_the_business_write_exactly_once(db: Db) -> None:
    barrier = CTX.Barrier(RACERS)
    results = CTX.Queue()
    processes = [
        CTX.Process(target=race, args=(db.url, db.tables, "race-1", f"p{i}", barrier, results), name=f"p{i}")
        for i in range(RACERS)
    ]
    for process in processes:
        process.start()
    outcomes = collect(results, RACERS)
    join_all(processes)

    assert [error for *_, error in outcomes if error] == []
    executed = [who for who, replayed, *_ in outcomes if replayed is False]
    assert len(executed) == 1, outcomes
    assert db.count(db.payments) == 1
    with db.engine.connect() as conn:
        assert conn.execute(sa.select(db.payments.c.executed_by)).scalar_one() == executed[0]
    # every loser got the winner's response, byte for byte
    bodies = {(status, body) for _, _, status, body, _ in outcomes}
    assert len(bodies) == 1
    status, body = bodies.pop()
    assert status == 201
    assert f'"charged_by":"{executed[0]}"'.encode() in body


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_a_process_dying_inside_the_transaction_leaves_no_record_and_no_effect(db: Db, how: str) -> None:
    inside = CTX.Event()
    doomed = CTX.Process(target=die_inside_transaction, args=(db.url, db.tables, "crash-1", how, inside))
    doomed.start()
    assert inside.wait(timeout=30), "the child never reached the business write"
    if how == "sigkill":
        assert doomed.pid is not None
        os.kill(doomed.pid, signal.SIGKILL)
    doomed.join(timeout=30)
    assert doomed.exitcode == (3 if how == "exit" else -signal.SIGKILL)

    assert db.record("crash-1") is None
    assert db.count(db.payments) == 0
    # the key is free again: the client's retry runs, once
    with db.engine.begin() as conn:
        retry = run_once(conn, "crash-1", charge(db.payments, "order-1", 500, "retry"), table=db.records)
    assert retry.replayed is False
    assert db.count(db.payments) == 1


@pytest.mark.slow
def test_waiters_behind_a_holder_that_is_killed_run_the_write_once(db: Db) -> None:
    """The holder dies while the others wait on its uncommitted row: one of them runs, the rest replay."""
    inside = CTX.Event()
    doomed = CTX.Process(
        target=die_inside_transaction, args=(db.url, db.tables, "crash-2", "sigkill", inside)
    )
    doomed.start()
    assert inside.wait(timeout=30)
    waiters = RACERS - 1
    barrier = CTX.Barrier(waiters)
    results = CTX.Queue()
    processes = [
        CTX.Process(target=race, args=(db.url, db.tables, "crash-2", f"w{i}", barrier, results), name=f"w{i}")
        for i in range(waiters)
    ]
    for process in processes:
        process.start()
    _queued_behind_the_holder(db, waiters)
    with pytest.raises(queue.Empty):
        results.get(timeout=0.1)  # nobody got past the uncommitted claim
    assert doomed.pid is not None
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.join(timeout=30)
    outcomes = collect(results, waiters)
    join_all(processes)

    assert [error for *_, error in outcomes if error] == []
    assert sum(1 for _, replayed, *_ in outcomes if replayed is False) == 1
    assert db.count(db.payments) == 1
    with db.engine.connect() as conn:
        assert conn.execute(sa.select(db.payments.c.executed_by)).scalar_one().startswith("w")


def test_a_duplicate_waits_for_the_uncommitted_first_request_then_replays_it(db: Db) -> None:
    inside = threading.Event()
    release = threading.Event()
    outcomes: dict[str, Any] = {}

    def first() -> None:
        def handler(conn: sa.Connection) -> Any:
            response = charge(db.payments, "order-1", 500, "first")(conn)
            inside.set()
            release.wait(timeout=30)
            return response

        with db.engine.begin() as conn:
            outcomes["first"] = run_once(conn, "wait-1", handler, table=db.records)

    def duplicate() -> None:
        with db.engine.begin() as conn:
            outcomes["duplicate"] = run_once(
                conn, "wait-1", charge(db.payments, "order-1", 500, "duplicate"), table=db.records
            )

    holder = threading.Thread(target=first)
    holder.start()
    assert inside.wait(timeout=30)
    waiter = threading.Thread(target=duplicate)
    waiter.start()
    _queued_behind_the_holder(db, 1)
    waiter.join(timeout=0.5)
    assert waiter.is_alive(), "the duplicate did not wait for the first request's transaction"
    release.set()
    holder.join(timeout=30)
    waiter.join(timeout=30)
    assert outcomes["first"].replayed is False
    assert outcomes["duplicate"].replayed is True
    assert outcomes["duplicate"].response == outcomes["first"].response
    assert db.count(db.payments) == 1
