"""The reconciler: finish two-phase operations whose holder died, through a callback of yours.

A ``begin`` takes a lease; if its holder crashes before ``complete`` or
``fail``, the record stays PROCESSING until the lease runs out, and then the
next caller simply starts over. When "starting over" is wrong (the charge may
have gone through), run the reconciler: it finds PROCESSING records whose
lease ran out, takes a fresh lease on each (fencing out the old holder, should
it wake up), and hands it to ``handler``, which looks at the outside world
(the payment provider, the order table) and answers with a decision:

- :class:`Complete` ``(result)``: the operation did happen; store its result
  (what a retry will be answered with);
- :class:`Fail` ``(error)``: it failed for good; later uses get ``token_failed``;
- :class:`Release` ``()``: it did not happen; the token is usable again;
- ``None``: not now; the reconciler's own lease runs out and the next run sees it again.

``dry_run=True`` only lists what would be handed over. The same for the SQL
backstop of :mod:`token_service.client.durable` (:func:`reconcile_durable`):
there the handler runs inside the transaction that records its decision.
Every step writes an audit line (``token_service.audit``).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from token_service.ops.admin import TOKEN, Admin, Filter, Record

if TYPE_CHECKING:
    import sqlalchemy as sa
    from sqlalchemy.engine import Connection, Engine

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "Complete",
    "Decision",
    "Fail",
    "Reconciled",
    "Release",
    "Stuck",
    "reconcile",
    "reconcile_durable",
]

audit_log = logging.getLogger("token_service.audit")
log = logging.getLogger(__name__)

DEFAULT_LEASE_SECONDS = 60


@dataclass(frozen=True)
class Complete:
    """The operation happened: store ``value`` as its result (SQL: a ``StoredResponse``)."""

    value: Any = None
    action: Literal["complete"] = "complete"


@dataclass(frozen=True)
class Fail:
    """The operation failed for good: store ``value`` as its error."""

    value: Any = None
    action: Literal["fail"] = "fail"


@dataclass(frozen=True)
class Release:
    """The operation did not happen: free the record for a retry."""

    value: Any = None
    action: Literal["release"] = "release"


Decision = Complete | Fail | Release | None


@dataclass(frozen=True)
class Stuck:
    """A PROCESSING record whose lease ran out, as handed to the handler.

    ``key`` is the record key (Redis key, or the SQL ``record_key``); ``ref`` the
    token_ref of the logs (Redis) or the record key (SQL). ``request_id`` is the
    id the dead holder's begin carried (Redis), so its logs can be found.
    """

    source: Literal["redis", "sql"]
    key: str
    ref: str
    scope: str | None
    subject: str | None
    fingerprint: str | None
    request_id: str | None
    lease_expired_at: datetime | str | None
    created_at: datetime | None = None


@dataclass(frozen=True)
class Reconciled:
    """What the reconciler did with one record.

    ``action``: ``dry_run``, ``complete``, ``fail``, ``release``, ``skip`` (the
    handler answered None), ``moved_on`` (someone else took it first) or
    ``handler_error``. ``outcome``: the store's answer (``succeeded``, ``failed``,
    ``released``, ``lease_lost``) or why nothing was done.
    """

    stuck: Stuck
    action: str
    outcome: str


def _audit(source: str, ref: str, action: str, outcome: str, actor: str) -> None:
    audit_log.info(
        "admin reconcile",
        extra={
            "audit": True,
            "actor": actor,
            "action": "reconcile",
            "source": source,
            "ref": ref,
            "decision": action,
            "outcome": outcome,
        },
    )


def _stuck_from(record: Record) -> Stuck:
    lease_expired_at = record.to_dict().get("lease_expires_at")
    return Stuck(
        "redis",
        record.key,
        record.ref,
        record.scope,
        record.subject,
        record.fingerprint,
        record.request_id,
        lease_expired_at,
    )


def reconcile(
    admin: Admin,
    handler: Callable[[Stuck], Decision],
    *,
    dry_run: bool = False,
    lease_seconds: int = DEFAULT_LEASE_SECONDS,
    count: int = 1000,
) -> list[Reconciled]:
    """Hand every token stuck in PROCESSING (lease run out) to ``handler``; see the module docs.

    ``handler`` runs under the reconciler's own lease of ``lease_seconds``: its
    decision is stored only if it answers within that time (else ``lease_lost``,
    and the next run sees the record again).
    """
    done: list[Reconciled] = []
    stuck_filter = Filter(kind=TOKEN, state="PROCESSING", lease_expired=True)
    for record in admin.walk(stuck_filter, count=count):
        stuck = _stuck_from(record)
        if dry_run:
            done.append(Reconciled(stuck, "dry_run", "stuck"))
            _audit("redis", record.ref, "dry_run", "stuck", admin.actor)
            continue
        lease_id = admin._take_over(record, lease_seconds)
        if lease_id is None:
            done.append(Reconciled(stuck, "moved_on", "taken by another caller, finished or expired"))
            _audit("redis", record.ref, "moved_on", "not taken", admin.actor)
            continue
        try:
            decision = handler(stuck)
        except Exception as exc:
            log.exception("reconcile handler failed on %s", record.ref)
            outcome = f"{type(exc).__name__}; the record is retried after {lease_seconds} s"
            done.append(Reconciled(stuck, "handler_error", outcome))
            _audit("redis", record.ref, "handler_error", type(exc).__name__, admin.actor)
            continue
        if decision is None:
            outcome = f"left; seen again after {lease_seconds} s"
            done.append(Reconciled(stuck, "skip", outcome))
            _audit("redis", record.ref, "skip", "left", admin.actor)
            continue
        outcome = admin._finish(record, lease_id, decision)
        done.append(Reconciled(stuck, decision.action, outcome))
        _audit("redis", record.ref, decision.action, outcome, admin.actor)
    return done


def reconcile_durable(
    engine: Engine,
    handler: Callable[[Stuck, Connection], Decision],
    *,
    table: sa.Table | None = None,
    dry_run: bool = False,
    lease_seconds: int = DEFAULT_LEASE_SECONDS,
    batch_size: int = 100,
    clock: Callable[[], datetime] | None = None,
    actor: str = "admin",
) -> list[Reconciled]:
    """The same for the SQL backstop: PROCESSING rows whose lease ran out (and not yet expired).

    Each row is taken over (fenced by its old lease id) in its own transaction;
    ``handler(stuck, conn)`` runs in that transaction, so business writes it
    makes commit together with the decision, or not at all if it raises
    (the row is then left as it was). Rows are visited in key order, once each,
    ``batch_size`` at a time (a SELECT that uses the primary key). Whether a lease ran
    out is asked of the database's clock, as the guard asks it (``clock``: tests only).
    """
    import sqlalchemy as sa

    from token_service.client.durable._guard import database_now
    from token_service.client.durable._schema import IDEMPOTENCY_RECORDS, PROCESSING

    table = IDEMPOTENCY_RECORDS if table is None else table
    done: list[Reconciled] = []
    last_key = ""
    while True:
        now = database_now(engine.dialect.name, clock=clock)
        with engine.connect() as conn:
            rows = conn.execute(
                sa.select(table.c.record_key, table.c.fingerprint, table.c.lease_id, table.c.lease_expires_at)
                .add_columns(table.c.created_at)
                .where(
                    table.c.record_key > last_key,
                    table.c.status == PROCESSING,
                    table.c.lease_expires_at <= now,
                    table.c.expires_at > now,
                )
                .order_by(table.c.record_key)
                .limit(batch_size)
            ).all()
        for row in rows:
            stuck = Stuck(
                "sql", row.record_key, row.record_key, None, None, row.fingerprint, None,
                row.lease_expires_at, row.created_at,
            )  # fmt: skip
            if dry_run:
                done.append(Reconciled(stuck, "dry_run", "stuck"))
                _audit("sql", row.record_key, "dry_run", "stuck", actor)
                continue
            done.append(_reconcile_row(engine, table, row, stuck, handler, lease_seconds, clock))
            _audit("sql", row.record_key, done[-1].action, done[-1].outcome, actor)
        if len(rows) < batch_size:
            return done
        last_key = rows[-1].record_key


class _HandlerFailed(Exception):
    pass


def _reconcile_row(
    engine: Engine,
    table: sa.Table,
    row: Any,
    stuck: Stuck,
    handler: Callable[[Stuck, Connection], Decision],
    lease_seconds: int,
    clock: Callable[[], datetime] | None,
) -> Reconciled:
    import sqlalchemy as sa

    from token_service.client.durable import Claim, complete, fail
    from token_service.client.durable._guard import database_now
    from token_service.client.durable._schema import PROCESSING
    from token_service.errors import LeaseLost

    result: Reconciled | None = None
    try:
        with engine.begin() as conn:
            dialect = conn.dialect.name
            now = database_now(dialect, clock=clock)
            lease_id = secrets.token_urlsafe(16)
            taken = conn.execute(
                sa.update(table)
                .where(
                    table.c.record_key == row.record_key,
                    table.c.status == PROCESSING,
                    table.c.lease_id == row.lease_id,
                    table.c.lease_expires_at <= now,
                )
                .values(
                    lease_id=lease_id,
                    lease_expires_at=database_now(dialect, lease_seconds, clock),
                    updated_at=now,
                )
            )
            if taken.rowcount != 1:
                return Reconciled(stuck, "moved_on", "taken by another caller or finished")
            ends = conn.execute(
                sa.select(table.c.lease_expires_at).where(table.c.record_key == row.record_key)
            ).scalar_one()
            claimed = Claim(row.record_key, lease_id, ends, taken_over=True)
            try:
                decision = handler(stuck, conn)
                if decision is None:
                    result = Reconciled(stuck, "skip", f"left; seen again after {lease_seconds} s")
                elif decision.action == "complete":
                    complete(conn, claimed, decision.value, table=table, clock=clock)
                    result = Reconciled(stuck, "complete", "succeeded")
                else:
                    retryable = decision.action == "release"
                    fail(conn, claimed, retryable=retryable, error=decision.value, table=table, clock=clock)
                    result = Reconciled(stuck, decision.action, "released" if retryable else "failed")
            except LeaseLost:
                raise
            except Exception as exc:
                log.exception("reconcile handler failed on %s", row.record_key)
                raise _HandlerFailed(type(exc).__name__) from exc
    except _HandlerFailed as failed:
        return Reconciled(stuck, "handler_error", f"{failed}; rolled back, the row is as it was")
    except LeaseLost:
        return Reconciled(stuck, "moved_on", "lease_lost")
    assert result is not None
    return result
