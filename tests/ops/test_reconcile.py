"""The reconciler: stuck PROCESSING tokens (real Redis, standalone and Cluster) and SQL backstop rows."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.ops.clock import past_clock
from token_service.client import durable
from token_service.client.durable._schema import IDEMPOTENCY_RECORDS
from token_service.errors import LeaseLost, TokenFailed
from token_service.ops import reconcile as reconciler
from token_service.ops.admin import Admin
from token_service.ops.reconcile import Complete, Fail, Release, Stuck
from token_service.records import IssueRequest, UseRequest
from token_service.store import TokenStore
from token_service.tokens import token_digest

PAY = IssueRequest("pay", "user-7", None, 600)


def _stuck_tokens(redis_any: Any, count: int) -> list[str]:
    """Tokens whose begin's holder "died": a lease that ran out 29 s ago."""
    past = TokenStore(redis_any, clock_ms=past_clock(30))
    tokens = past.issue(PAY, count)
    for i, token in enumerate(tokens):
        past.begin(UseRequest(token, "pay", "user-7", request_id=f"order-{i}"), lease_seconds=1)
    return tokens


def test_dry_run_lists_the_stuck_and_changes_nothing(redis_any: Any, store: TokenStore, admin: Admin) -> None:
    stuck = _stuck_tokens(redis_any, 3)
    live = store.issue(PAY, 1)[0]
    store.begin(
        UseRequest(live, "pay", "user-7"), lease_seconds=300
    )  # a holder still within its lease: not stuck
    called: list[Stuck] = []

    done = reconciler.reconcile(admin, called.append, dry_run=True)  # type: ignore[arg-type,func-returns-value]

    assert called == []
    assert sorted(item.stuck.ref for item in done) == sorted(token_digest(t) for t in stuck)
    assert {item.action for item in done} == {"dry_run"}
    assert {item.stuck.request_id for item in done} == {"order-0", "order-1", "order-2"}
    assert all(admin.show(token_digest(t)).state == "PROCESSING" for t in stuck)


def test_each_decision_is_stored_under_the_reconcilers_own_lease(
    redis_any: Any, store: TokenStore, admin: Admin
) -> None:
    completed, failed, released, skipped, broken = _stuck_tokens(redis_any, 5)
    decisions: dict[str, Any] = {
        token_digest(completed): Complete({"charge": "ch_9", "recovered": True}),
        token_digest(failed): Fail({"reason": "provider says declined"}),
        token_digest(released): Release(),
        token_digest(skipped): None,
    }

    def handler(stuck: Stuck) -> Any:
        assert stuck.scope == "pay"
        assert stuck.subject == "user-7"
        assert stuck.request_id is not None
        assert stuck.request_id.startswith("order-")
        if stuck.ref == token_digest(broken):
            raise RuntimeError("payment provider timed out")
        return decisions[stuck.ref]

    done = {item.stuck.ref: (item.action, item.outcome) for item in reconciler.reconcile(admin, handler)}

    assert done[token_digest(completed)] == ("complete", "succeeded")
    assert done[token_digest(failed)] == ("fail", "failed")
    assert done[token_digest(released)] == ("release", "released")
    assert done[token_digest(skipped)][0] == "skip"
    assert done[token_digest(broken)][0] == "handler_error"
    # what the clients' retries now get
    assert store.begin(UseRequest(completed, "pay", "user-7")).result == {"charge": "ch_9", "recovered": True}  # type: ignore[union-attr]
    with pytest.raises(TokenFailed):
        store.begin(UseRequest(failed, "pay", "user-7"))
    assert store.consume(UseRequest(released, "pay", "user-7")).replayed is False
    # skipped and broken ones stay held by the reconciler's lease, and come back once it runs out
    assert admin.show(token_digest(skipped)).lease_expired is False
    assert reconciler.reconcile(admin, handler, dry_run=True) == []


def test_the_dead_holder_waking_up_is_fenced_out(redis_any: Any, admin: Admin) -> None:
    past = TokenStore(redis_any, clock_ms=past_clock(30))
    [token] = past.issue(PAY, 1)
    dead = past.begin(UseRequest(token, "pay", "user-7", request_id="order-1"), lease_seconds=1)
    reconciler.reconcile(admin, lambda stuck: Complete({"charge": "ch_1"}))
    with pytest.raises(LeaseLost):
        TokenStore(redis_any).complete(token, dead.lease_id, {"charge": "ch_2"})  # type: ignore[union-attr]
    assert admin.show(token_digest(token)).result == {"charge": "ch_1"}


def test_a_record_retried_by_its_client_first_is_left_alone(redis_any: Any, admin: Admin) -> None:
    [token] = _stuck_tokens(redis_any, 1)
    TokenStore(redis_any).begin(
        UseRequest(token, "pay", "user-7", request_id="client-retry"), lease_seconds=300
    )

    def handler(stuck: Stuck) -> Any:
        raise AssertionError("never handed over: the client's retry holds it")

    assert reconciler.reconcile(admin, handler) == []  # its lease is live again: not stuck


# -- the SQL backstop (SQLite: the statements are dialect-neutral SQLAlchemy Core) -----------------


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'records.db'}")
    durable.create_records_table(engine)
    yield engine
    engine.dispose()


def _claim(engine: Any, key: str, seconds_ago: float, lease_seconds: int = 1) -> durable.Claim:
    """A committed PROCESSING row (the two-transaction flow) whose holder then died."""
    with engine.begin() as conn:
        claimed = durable.claim(
            conn,
            key,
            fingerprint="fp-" + key,
            lease_seconds=lease_seconds,
            clock=lambda: durable.utc_now() - timedelta(seconds=seconds_ago),
        )
    assert isinstance(claimed, durable.Claim)
    return claimed


def test_sql_rows_whose_lease_ran_out_are_handed_over_in_the_decisions_transaction(engine: Any) -> None:
    for key in ("token:done", "token:failed", "token:released", "token:broken"):
        _claim(engine, key, seconds_ago=60)
    _claim(engine, "token:live", seconds_ago=0, lease_seconds=300)
    payments = sa.Table("payments", sa.MetaData(), sa.Column("key", sa.String(64), primary_key=True))
    payments.create(engine)

    dry = reconciler.reconcile_durable(engine, lambda stuck, conn: None, dry_run=True)
    assert [item.stuck.key for item in dry] == [
        "token:broken",
        "token:done",
        "token:failed",
        "token:released",
    ]

    def handler(stuck: Stuck, conn: Any) -> Any:
        # a business write in the same transaction as the decision
        conn.execute(payments.insert().values(key=stuck.key))
        if stuck.key == "token:done":
            return Complete(durable.StoredResponse.json(201, {"charge": "ch_3"}))
        if stuck.key == "token:failed":
            return Fail({"reason": "declined"})
        if stuck.key == "token:released":
            return Release()
        raise RuntimeError("provider down")

    done = {
        item.stuck.key: (item.action, item.outcome) for item in reconciler.reconcile_durable(engine, handler)
    }
    assert done["token:done"] == ("complete", "succeeded")
    assert done["token:failed"] == ("fail", "failed")
    assert done["token:released"] == ("release", "released")
    assert done["token:broken"][0] == "handler_error"
    assert "token:live" not in done

    with engine.connect() as conn:
        rows = {row.record_key: row for row in conn.execute(sa.select(IDEMPOTENCY_RECORDS))}
        paid = set(conn.execute(sa.select(payments.c.key)).scalars())
    assert rows["token:done"].status == "SUCCEEDED"
    assert rows["token:failed"].status == "FAILED"
    assert "token:released" not in rows  # deleted: the retry runs
    assert rows["token:broken"].status == "PROCESSING"  # rolled back, its write with it
    assert paid == {"token:done", "token:failed", "token:released"}
    with engine.begin() as conn:
        replay = durable.claim(conn, "token:done", fingerprint="fp-token:done")
    assert isinstance(replay, durable.Replay)
    assert replay.response.payload() == {"charge": "ch_3"}


def test_a_sql_holder_that_wakes_up_after_the_takeover_is_fenced_out(engine: Any) -> None:
    dead = _claim(engine, "token:late", seconds_ago=60)
    reconciler.reconcile_durable(engine, lambda stuck, conn: Complete(durable.StoredResponse(200, b"ok")))
    with pytest.raises(LeaseLost), engine.begin() as conn:
        durable.complete(conn, dead, durable.StoredResponse(200, b"second"))
