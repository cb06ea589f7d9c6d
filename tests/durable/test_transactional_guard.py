"""The transactional guard on SQLite, PostgreSQL and MariaDB: run once, replay, roll back, two-phase."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

from tests.durable.databases import Db
from tests.durable.workers import charge
from token_service.client.durable import (
    Claim,
    FingerprintMismatch,
    RecordFailed,
    RecordInProgress,
    Replay,
    StoredResponse,
    claim,
    complete,
    fail,
    request_fingerprint,
    retry_transaction,
    run_once,
)
from token_service.client.durable._guard import is_retryable
from token_service.errors import LeaseLost


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = datetime(2030, 1, 1, 12, 0, 0)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def test_second_run_replays_the_stored_response_byte_for_byte(db: Db) -> None:
    # Not UTF-8, a NUL, CRLF: whatever the handler answered comes back unchanged.
    body = b'\x00\xff\xfe{"charged": true}\r\n\x80'
    first_response = StoredResponse(202, body, {"Content-Type": "application/octet-stream", "X-Id": "p-1"})
    calls: list[int] = []

    def handler(conn: sa.Connection) -> StoredResponse:
        calls.append(1)
        conn.execute(sa.insert(db.payments).values(order_id="o-1", amount_cents=100, executed_by="first"))
        return first_response

    with db.engine.begin() as conn:
        first = run_once(conn, "pay-1", handler, table=db.records)
    with db.engine.begin() as conn:
        second = run_once(conn, "pay-1", handler, table=db.records)

    assert first.replayed is False
    assert second.replayed is True
    assert second.response.body == body
    assert second.response.status == 202
    assert dict(second.response.headers) == {"Content-Type": "application/octet-stream", "X-Id": "p-1"}
    assert calls == [1]
    assert db.count(db.payments) == 1
    row = db.record("pay-1")
    assert row is not None
    assert row.status == "SUCCEEDED"
    assert row.lease_id is None


def test_json_response_replays_identically(db: Db) -> None:
    with db.engine.begin() as conn:
        first = run_once(conn, "pay-json", charge(db.payments, "o-2", 250, "a"), table=db.records)
    with db.engine.begin() as conn:
        second = run_once(conn, "pay-json", charge(db.payments, "o-2", 250, "b"), table=db.records)
    assert second.replayed
    assert second.response == first.response
    assert second.response.payload() == {"order_id": "o-2", "amount_cents": 250, "charged_by": "a"}


def test_keys_that_differ_only_in_case_are_different_records(db: Db) -> None:
    # Token digests are base64url: MySQL's default case-insensitive collation would merge these.
    for key, who in (("AbC-1", "upper"), ("abc-1", "lower"), ("abc-1 ".strip(), "again")):
        with db.engine.begin() as conn:
            run_once(conn, key, charge(db.payments, key, 1, who), table=db.records)
    assert db.count(db.payments) == 2
    assert db.count(db.records) == 2


def test_same_key_with_a_different_request_is_refused(db: Db) -> None:
    with db.engine.begin() as conn:
        run_once(
            conn,
            "pay-fp",
            charge(db.payments, "o-3", 100, "a"),
            fingerprint=request_fingerprint({"amount_cents": 100}),
            table=db.records,
        )
    with pytest.raises(FingerprintMismatch) as refused, db.engine.begin() as conn:
        run_once(
            conn,
            "pay-fp",
            charge(db.payments, "o-3", 999, "b"),
            fingerprint=request_fingerprint({"amount_cents": 999}),
            table=db.records,
        )
    assert refused.value.key == "pay-fp"
    assert refused.value.status == 422
    assert db.count(db.payments) == 1


def test_an_exception_in_the_handler_leaves_neither_record_nor_effect(db: Db) -> None:
    def boom(conn: sa.Connection) -> StoredResponse:
        charge(db.payments, "o-4", 100, "boom")(conn)
        raise RuntimeError("card network timeout")

    with pytest.raises(RuntimeError, match="card network"), db.engine.begin() as conn:
        run_once(conn, "pay-boom", boom, table=db.records)
    assert db.record("pay-boom") is None
    assert db.count(db.payments) == 0

    # and the key is free: the retry runs
    with db.engine.begin() as conn:
        retried = run_once(conn, "pay-boom", charge(db.payments, "o-4", 100, "retry"), table=db.records)
    assert retried.replayed is False
    assert db.count(db.payments) == 1


def test_a_failure_after_the_guard_in_the_same_transaction_also_rolls_back_the_record(db: Db) -> None:
    def guarded_then_broken() -> None:
        with db.engine.begin() as conn:
            run_once(conn, "pay-late", charge(db.payments, "o-5", 100, "a"), table=db.records)
            raise ZeroDivisionError("a later step of the same transaction")

    with pytest.raises(ZeroDivisionError):
        guarded_then_broken()
    assert db.record("pay-late") is None
    assert db.count(db.payments) == 0


def test_the_guard_refuses_to_run_outside_a_transaction(db: Db) -> None:
    with db.engine.connect() as conn, pytest.raises(ValueError, match=r"engine\.begin"):
        run_once(conn, "pay-x", charge(db.payments, "o", 1, "a"), table=db.records)


@pytest.mark.parametrize("key", ["", "has space", "x" * 256, "naïve"])
def test_malformed_keys_are_refused_before_sql(db: Db, key: str) -> None:
    with db.engine.begin() as conn, pytest.raises(ValueError, match="visible ASCII"):
        run_once(conn, key, charge(db.payments, "o", 1, "a"), table=db.records)
    assert db.count(db.records) == 0


def test_two_phase_claim_lease_takeover_and_fencing(db: Db) -> None:
    """Claim committed on its own (work outside the database in between): in progress, then take over."""
    clock = Clock()
    with db.engine.begin() as conn:
        first = claim(conn, "pay-2p", lease_seconds=10, table=db.records, clock=clock)
    assert isinstance(first, Claim)

    with pytest.raises(RecordInProgress) as busy, db.engine.begin() as conn:
        claim(conn, "pay-2p", table=db.records, clock=clock)
    assert busy.value.retry_after_seconds == 10
    assert busy.value.status == 409

    clock.advance(11)  # the first holder crashed: its lease ran out
    with db.engine.begin() as conn:
        second = claim(conn, "pay-2p", lease_seconds=10, table=db.records, clock=clock)
    assert isinstance(second, Claim)
    assert second.taken_over
    assert second.lease_id != first.lease_id

    with pytest.raises(LeaseLost), db.engine.begin() as conn:
        complete(conn, first, StoredResponse(201, b"late"), table=db.records, clock=clock)
    with db.engine.begin() as conn:
        complete(conn, second, StoredResponse(201, b"on time"), table=db.records, clock=clock)
    with db.engine.begin() as conn:
        replay = claim(conn, "pay-2p", table=db.records, clock=clock)
    assert isinstance(replay, Replay)
    assert replay.response.body == b"on time"


def test_permanent_failure_is_recorded_and_retryable_failure_frees_the_key(db: Db) -> None:
    with db.engine.begin() as conn:
        held = claim(conn, "pay-declined", table=db.records)
        assert isinstance(held, Claim)
        fail(conn, held, retryable=False, error={"reason": "card_declined"}, table=db.records)
    with pytest.raises(RecordFailed) as failed, db.engine.begin() as conn:
        run_once(conn, "pay-declined", charge(db.payments, "o", 1, "a"), table=db.records)
    assert failed.value.error == {"reason": "card_declined"}

    with db.engine.begin() as conn:
        held = claim(conn, "pay-flaky", table=db.records)
        assert isinstance(held, Claim)
        fail(conn, held, retryable=True, table=db.records)
    assert db.record("pay-flaky") is None
    with db.engine.begin() as conn:
        assert not run_once(conn, "pay-flaky", charge(db.payments, "o", 1, "a"), table=db.records).replayed
    assert db.count(db.payments) == 1


def test_an_expired_record_counts_as_absent(db: Db) -> None:
    clock = Clock()
    with db.engine.begin() as conn:
        run_once(
            conn, "pay-old", charge(db.payments, "o", 1, "a"), ttl_seconds=60, table=db.records, clock=clock
        )
    clock.advance(59)
    with db.engine.begin() as conn:
        assert run_once(
            conn, "pay-old", charge(db.payments, "o", 1, "b"), table=db.records, clock=clock
        ).replayed
    clock.advance(2)
    with db.engine.begin() as conn:
        again = run_once(conn, "pay-old", charge(db.payments, "o", 1, "c"), table=db.records, clock=clock)
    assert not again.replayed
    assert db.count(db.payments) == 2


def test_deadlocks_and_serialization_failures_are_retried_and_nothing_else() -> None:
    import psycopg
    import pymysql

    def wrapped(orig: Exception) -> sa.exc.DBAPIError:
        return sa.exc.OperationalError("INSERT …", {}, orig)

    deadlock = wrapped(pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock"))
    serialization = wrapped(psycopg.errors.SerializationFailure("could not serialize access"))
    duplicate = wrapped(pymysql.err.IntegrityError(1062, "Duplicate entry"))
    assert is_retryable(deadlock)
    assert is_retryable(serialization)
    assert not is_retryable(duplicate)
    assert not is_retryable(RuntimeError("x"))

    engine = sa.create_engine("sqlite://")
    attempts: list[int] = []

    def work(conn: sa.Connection) -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise deadlock
        return "done"

    assert retry_transaction(engine, work, backoff_seconds=0) == "done"
    assert len(attempts) == 3

    def broken(conn: sa.Connection) -> str:
        attempts.append(1)
        raise duplicate

    attempts.clear()
    with pytest.raises(sa.exc.OperationalError):
        retry_transaction(engine, broken, backoff_seconds=0)
    assert len(attempts) == 1
    engine.dispose()
