"""State-machine transitions and optimistic-lock updates: legal moves pass, the rest are refused."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

from tests.durable.databases import Db
from token_service.client.durable import (
    IllegalTransition,
    RowNotFound,
    StaleVersion,
    StateMachine,
    update_versioned,
)

TRANSITIONS = {
    "CREATED": {"PAID", "CANCELLED"},
    "PAID": {"SHIPPED", "REFUNDING"},
    "SHIPPED": {"COMPLETED"},
    "REFUNDING": {"REFUNDED"},
    "COMPLETED": set(),
    "CANCELLED": set(),
    "REFUNDED": set(),
}


def add_order(db: Db, order_id: int, status: str = "CREATED") -> None:
    with db.engine.begin() as conn:
        conn.execute(sa.insert(db.orders).values(id=order_id, status=status, version=0))


def order(db: Db, order_id: int) -> Any:
    with db.engine.connect() as conn:
        return conn.execute(sa.select(db.orders).where(db.orders.c.id == order_id)).one()


@contextmanager
def statements(engine: sa.Engine) -> Iterator[list[str]]:
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


def test_legal_transitions_move_the_row_and_write_values_with_it(db: Db) -> None:
    machine = StateMachine(db.orders, TRANSITIONS)
    add_order(db, 1)
    with db.engine.begin() as conn:
        machine.transition(conn, 1, "PAID", values={"note": "card"})
        machine.transition(conn, 1, "SHIPPED", expected="PAID")
    row = order(db, 1)
    assert (row.status, row.note) == ("SHIPPED", "card")


def test_an_undeclared_move_is_refused_before_touching_the_database(db: Db) -> None:
    machine = StateMachine(db.orders, TRANSITIONS)
    add_order(db, 2)
    with statements(db.engine) as seen, db.engine.begin() as conn:
        with pytest.raises(IllegalTransition, match="not an allowed transition") as refused:
            machine.transition(conn, 2, "SHIPPED", expected="CREATED")
        with pytest.raises(IllegalTransition, match="not a state"):
            machine.transition(conn, 2, "TELEPORTED")
    assert not [s for s in seen if "UPDATE" in s.upper() or "SELECT" in s.upper()]
    assert refused.value.allowed_from == frozenset({"PAID"})
    assert order(db, 2).status == "CREATED"


def test_a_move_from_the_wrong_current_state_is_refused_and_says_which_state_it_was_in(db: Db) -> None:
    machine = StateMachine(db.orders, TRANSITIONS)
    add_order(db, 3, "CANCELLED")
    with pytest.raises(IllegalTransition) as refused, db.engine.begin() as conn:
        machine.transition(conn, 3, "PAID")
    assert refused.value.current == "CANCELLED"
    assert refused.value.target == "PAID"
    assert "row 3 is CANCELLED" in str(refused.value)
    assert not refused.value.already
    assert order(db, 3).status == "CANCELLED"


def test_a_duplicate_move_is_refused_and_recognisable_as_already_done(db: Db) -> None:
    machine = StateMachine(db.orders, TRANSITIONS)
    add_order(db, 4)
    with db.engine.begin() as conn:
        machine.transition(conn, 4, "PAID")
    with pytest.raises(IllegalTransition) as refused, db.engine.begin() as conn:
        machine.transition(conn, 4, "PAID")
    assert refused.value.already
    assert refused.value.status == 409


def test_transition_of_a_missing_row(db: Db) -> None:
    machine = StateMachine(db.orders, TRANSITIONS)
    with pytest.raises(RowNotFound), db.engine.begin() as conn:
        machine.transition(conn, 404, "PAID")


def test_a_transition_table_with_undeclared_targets_is_rejected() -> None:
    metadata = sa.MetaData()
    table = sa.Table(
        "t", metadata, sa.Column("id", sa.Integer, primary_key=True), sa.Column("status", sa.String)
    )
    with pytest.raises(ValueError, match="LOST"):
        StateMachine(table, {"NEW": {"LOST"}})


def test_versioned_update_bumps_the_version_and_refuses_a_stale_one(db: Db) -> None:
    add_order(db, 5)
    with db.engine.begin() as conn:
        assert update_versioned(conn, db.orders, 5, 0, {"note": "first"}) == 1
    with pytest.raises(StaleVersion) as stale, db.engine.begin() as conn:
        update_versioned(conn, db.orders, 5, 0, {"note": "lost update"})
    assert (stale.value.expected, stale.value.actual) == (0, 1)
    row = order(db, 5)
    assert (row.version, row.note) == (1, "first")
    with pytest.raises(RowNotFound), db.engine.begin() as conn:
        update_versioned(conn, db.orders, 404, 0, {"note": "x"})
    with pytest.raises(ValueError, match="maintained"), db.engine.begin() as conn:
        update_versioned(conn, db.orders, 5, 1, {"version": 7})


def test_concurrent_versioned_updates_from_the_same_version_let_exactly_one_win(db: Db) -> None:
    add_order(db, 6)
    writers = 5
    barrier = threading.Barrier(writers)
    won: list[str] = []
    stale: list[int | None] = []
    errors: list[BaseException] = []

    def write(name: str) -> None:
        try:
            barrier.wait(timeout=30)
            with db.engine.begin() as conn:
                update_versioned(conn, db.orders, 6, 0, {"note": name})
            won.append(name)
        except StaleVersion as exc:
            stale.append(exc.actual)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(f"t{i}",)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert len(won) == 1
    assert stale == [1] * (writers - 1)
    assert (order(db, 6).version, order(db, 6).note) == (1, won[0])
