"""token_service.ops.reconcile.reconcile_durable on SQLite, PostgreSQL and MariaDB: stuck PROCESSING rows
taken over (fenced by their lease id), decided in the decision's own transaction, each visited once."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from tests.durable.databases import Db
from token_service.client import durable
from token_service.errors import LeaseLost
from token_service.ops.reconcile import Complete, Fail, Release, Stuck, reconcile_durable


def _stuck_claim(db: Db, key: str, seconds_ago: float = 120, lease_seconds: int = 30) -> durable.Claim:
    with db.engine.begin() as conn:
        claimed = durable.claim(
            conn,
            key,
            fingerprint="fp",
            lease_seconds=lease_seconds,
            table=db.records,
            clock=lambda: durable.utc_now() - timedelta(seconds=seconds_ago),
        )
    assert isinstance(claimed, durable.Claim)
    return claimed


def test_decisions_commit_with_the_handlers_writes_and_roll_back_with_its_errors(db: Db) -> None:
    dead = {key: _stuck_claim(db, key) for key in ("k:complete", "k:fail", "k:release", "k:raise", "k:skip")}
    _stuck_claim(db, "k:live", seconds_ago=0, lease_seconds=300)
    seen: list[str] = []

    def decide(stuck: Stuck, conn: Any) -> Any:
        seen.append(stuck.key)
        conn.execute(
            db.payments.insert().values(order_id=stuck.key, amount_cents=100, executed_by="reconciler")
        )
        if stuck.key == "k:raise":
            raise RuntimeError("provider down")
        return {
            "k:complete": Complete(durable.StoredResponse.json(201, {"ok": True})),
            "k:fail": Fail({"reason": "declined"}),
            "k:release": Release(),
            "k:skip": None,
        }[stuck.key]

    assert [item.action for item in reconcile_durable(db.engine, decide, table=db.records, dry_run=True)] == [
        "dry_run"
    ] * 5
    done = {item.stuck.key: item.action for item in reconcile_durable(db.engine, decide, table=db.records)}

    assert sorted(seen) == sorted(dead)  # each stuck row once, the live one never
    assert done == {
        "k:complete": "complete",
        "k:fail": "fail",
        "k:release": "release",
        "k:raise": "handler_error",
        "k:skip": "skip",
    }
    with db.engine.connect() as conn:
        status = dict(conn.execute(sa.select(db.records.c.record_key, db.records.c.status)).all())
        paid = set(conn.execute(sa.select(db.payments.c.order_id)).scalars())
    assert status["k:complete"] == "SUCCEEDED"
    assert status["k:fail"] == "FAILED"
    assert "k:release" not in status
    assert status["k:raise"] == "PROCESSING"
    assert status["k:skip"] == "PROCESSING"  # held by the reconciler's own lease until it runs out
    assert paid == {"k:complete", "k:fail", "k:release", "k:skip"}
    assert reconcile_durable(db.engine, decide, table=db.records, dry_run=True)[0].stuck.key == "k:raise"
    with pytest.raises(LeaseLost), db.engine.begin() as conn:
        durable.complete(conn, dead["k:complete"], durable.StoredResponse(200), table=db.records)
