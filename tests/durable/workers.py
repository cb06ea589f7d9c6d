"""Business handlers and child-process bodies of the durable tests (module level: children import them)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from tests.durable.databases import Tables, make_engine
from token_service.client.durable import StoredResponse, retry_transaction, run_once


def charge(
    payments: sa.Table, order_id: str, amount_cents: int, who: str, hold_seconds: float = 0.0
) -> Callable[[sa.Connection], StoredResponse]:
    """A payment: insert the charge row, answer 201 with it."""

    def handler(conn: sa.Connection) -> StoredResponse:
        conn.execute(
            sa.insert(payments).values(order_id=order_id, amount_cents=amount_cents, executed_by=who)
        )
        if hold_seconds:
            time.sleep(hold_seconds)  # widen the window in which the others race us
        return StoredResponse.json(
            201, {"order_id": order_id, "amount_cents": amount_cents, "charged_by": who}, {"X-Charge": who}
        )

    return handler


def race(url: str, tables: Tables, key: str, who: str, barrier: Any, results: Any) -> None:
    engine = make_engine(url)
    _, records, payments, _ = tables.bind()
    try:
        barrier.wait(timeout=30)
        # A deadlock among waiters (InnoDB, when the holder rolls back) means: run it again.
        outcome = retry_transaction(
            engine,
            lambda conn: run_once(conn, key, charge(payments, "order-1", 500, who, 0.2), table=records),
        )
        results.put((who, outcome.replayed, outcome.response.status, outcome.response.body, None))
    except Exception as exc:
        results.put((who, None, None, None, repr(exc)))
    finally:
        engine.dispose()


def die_inside_transaction(url: str, tables: Tables, key: str, how: str, inside: Any) -> None:
    """Claim the key, write the charge, then die without committing: ``exit`` or wait for SIGKILL."""
    engine = make_engine(url)
    _, records, payments, _ = tables.bind()

    def handler(conn: sa.Connection) -> StoredResponse:
        response = charge(payments, "order-1", 500, "doomed")(conn)
        inside.set()
        if how == "exit":
            os._exit(3)  # no rollback, no connection close: the process is just gone
        time.sleep(60)  # the parent SIGKILLs us here
        return response

    with engine.begin() as conn:
        run_once(conn, key, handler, table=records)
