"""The transactional guard: claim a record, run the business writes, store the response.

Everything happens on the caller's ``Connection`` inside the caller's transaction, so the record
and the business effect commit together or not at all. The claim is one atomic insert-or-detect
statement, never a SELECT then an INSERT (which two requests can both pass); MySQL/MariaDB's row
count cannot tell "inserted" from "found", so there ownership is read back through the fresh
lease id. Every time a claim writes or compares is the **database's** clock (:func:`database_now`):
app servers whose clocks disagree share their database's. docs/durable.md says what each database
does and what a concurrent duplicate sees (it waits on the first one's row, then replays it).
"""

from __future__ import annotations

import inspect
import json
import math
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict, TypeVar, Unpack

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Connection

from token_service import defaults
from token_service.client._engine import GuardEngine
from token_service.client._stored_response import StoredResponse
from token_service.client._telemetry import DURABLE_SPAN_NAME, Telemetry
from token_service.client.durable._schema import (
    FAILED,
    IDEMPOTENCY_RECORDS,
    PROCESSING,
    SUCCEEDED,
    check_fingerprint,
    check_key,
)
from token_service.errors import (
    FingerprintMismatch,
    LeaseLost,
    RecordFailed,
    RecordInProgress,
    TokenInvalid,
    TokenUsed,
)
from token_service.tokens import is_well_formed, token_digest

__all__ = [
    "Claim",
    "Clock",
    "Outcome",
    "Replay",
    "RunOptions",
    "claim",
    "complete",
    "database_now",
    "fail",
    "is_retryable",
    "retry_transaction",
    "run_once",
    "run_once_for_token",
    "token_record_key",
    "utc_now",
]

# Longer than the longest token TTL (MAX_TTL_SECONDS, 86400 by default) on
# purpose: the record must outlive every token that could still be presented.
DEFAULT_RECORD_TTL_SECONDS = 7 * 86400
DEFAULT_LEASE_SECONDS = defaults.DEFAULT_LEASE_SECONDS
_CLAIM_ATTEMPTS = 3

Clock = Callable[[], datetime]
_T = TypeVar("_T")


def utc_now() -> datetime:
    """This host's clock as naive UTC, as the table stores it (a ``clock`` to pass on purpose:
    the guard itself reads the database's, :func:`database_now`)."""
    return datetime.now(UTC).replace(tzinfo=None)


def database_now(
    dialect: str, plus_seconds: float = 0.0, clock: Clock | None = None
) -> sa.ColumnElement[datetime]:
    """The database's current time (naive UTC) ``plus_seconds`` on, as SQL that the database
    evaluates when it runs the statement it is part of.

    PostgreSQL's ``clock_timestamp()`` (not ``now()``: that is when the transaction began, which
    a long transaction would date a new lease by), MySQL/MariaDB's ``UTC_TIMESTAMP(6)``, and
    SQLite's ``'now'`` (a file on this host: its clock is this host's, the only one there is).
    With ``clock`` (tests), that clock's reading as a bound value instead.
    """
    if clock is not None:
        value = sa.literal(clock() + timedelta(seconds=plus_seconds), sa.DateTime())
        if dialect in ("mysql", "mariadb"):  # a parameter reads back as text there, unless cast
            return sa.cast(value, mysql.DATETIME(fsp=6))
        return value
    if dialect == "postgresql":
        now: Any = sa.func.timezone("UTC", sa.func.clock_timestamp())
        if plus_seconds:
            now = now + sa.func.make_interval(0, 0, 0, 0, 0, 0, float(plus_seconds))
        return sa.type_coerce(now, sa.DateTime())
    if dialect in ("mysql", "mariadb"):
        micros = round(plus_seconds * 1_000_000)  # a number we computed: safe to write into the SQL
        sql = f"TIMESTAMPADD(MICROSECOND, {micros}, UTC_TIMESTAMP(6))" if micros else "UTC_TIMESTAMP(6)"
        return sa.literal_column(sql, sa.DateTime())
    if dialect == "sqlite":
        # the format SQLAlchemy stores SQLite datetimes in ('%f' is seconds with 3 decimals)
        text = sa.func.strftime("%Y-%m-%d %H:%M:%f000", "now", f"{plus_seconds:+.6f} seconds")
        return sa.type_coerce(text, sa.DateTime())
    raise _unsupported(dialect)


@dataclass(frozen=True)
class Outcome:
    """The result of ``run_once``: the response, and whether it was replayed from the record."""

    response: StoredResponse
    replayed: bool


@dataclass(frozen=True)
class Claim:
    """We own the key: do the work, then ``complete`` or ``fail`` with ``lease_id``."""

    key: str
    lease_id: str
    lease_expires_at: datetime  # the database's clock: compare it only with database_now()
    taken_over: bool = False


@dataclass(frozen=True)
class Replay:
    """The key finished before: here is its stored response."""

    key: str
    response: StoredResponse


def token_record_key(token: str, namespace: str = "token") -> str:
    """The record key of a token: its digest (never the token), so Redis and the database agree."""
    if not is_well_formed(token):
        raise TokenInvalid("malformed token")
    return f"{namespace}:{token_digest(token)}"


def _require_transaction(conn: Connection) -> None:
    if not isinstance(conn, Connection) or not conn.in_transaction():
        raise ValueError(
            "the guard runs inside your transaction: pass the Connection of a "
            "`with engine.begin() as conn:` block"
        )


def _unsupported(dialect: str) -> NotImplementedError:
    return NotImplementedError(
        f"idempotency records support PostgreSQL, MySQL/MariaDB and SQLite, not {dialect}"
    )


def _insert_or_detect(conn: Connection, table: sa.Table, values: dict[str, Any]) -> datetime | None:
    """Insert the claim unless the key exists: its lease's end (the database's clock) when the
    insert can tell that it created the row, else None (the key existed, or MySQL: read it back)."""
    name = conn.dialect.name
    if name in ("postgresql", "sqlite"):
        insert = (postgresql if name == "postgresql" else sqlite).insert(table).values(values)
        new = insert.on_conflict_do_nothing(index_elements=["record_key"]).returning(table.c.lease_expires_at)
        inserted: datetime | None = conn.execute(new).scalar_one_or_none()
        return inserted
    if name in ("mysql", "mariadb"):
        my = mysql.insert(table).values(values)
        conn.execute(my.on_duplicate_key_update(record_key=my.inserted.record_key))
        return None
    raise _unsupported(name)


def _stored_response(row: sa.Row[Any]) -> StoredResponse:
    headers = json.loads(row.response_headers) if row.response_headers else {}
    return StoredResponse(int(row.response_status), bytes(row.response_body or b""), headers)


def claim(
    conn: Connection,
    key: str,
    *,
    fingerprint: str | None = None,
    lease_seconds: int = DEFAULT_LEASE_SECONDS,
    ttl_seconds: int = DEFAULT_RECORD_TTL_SECONDS,
    table: sa.Table = IDEMPOTENCY_RECORDS,
    clock: Clock | None = None,
) -> Claim | Replay:
    """Claim ``key`` on ``conn`` (inside its transaction), or learn what became of it.

    A ``Claim`` when the caller owns the key (new, expired, or a PROCESSING record whose lease
    ran out: ``taken_over``), else a ``Replay`` of the stored response, or ``FingerprintMismatch``,
    ``RecordFailed``, ``RecordInProgress`` (a committed claim's live lease: the two-transaction
    flow). Whether a lease is live is asked of the database's clock (``clock``: tests only).
    """
    _require_transaction(conn)
    check_key(key)
    check_fingerprint(fingerprint)
    if not 1 <= lease_seconds <= ttl_seconds:
        raise ValueError("lease_seconds must be at least 1 and at most ttl_seconds")
    dialect = conn.dialect.name
    now = database_now(dialect, clock=clock)
    lease_id = secrets.token_urlsafe(16)
    lease_expires_at = database_now(dialect, lease_seconds, clock)
    fresh = {
        "status": PROCESSING,
        "fingerprint": fingerprint,
        "lease_id": lease_id,
        "lease_expires_at": lease_expires_at,
        "response_status": None,
        "response_headers": None,
        "response_body": None,
        "error": None,
        "created_at": now,
        "updated_at": now,
        "expires_at": database_now(dialect, ttl_seconds, clock),
    }
    where_key = table.c.record_key == key
    for _ in range(_CLAIM_ATTEMPTS):
        inserted = _insert_or_detect(conn, table, {"record_key": key, **fresh})
        if inserted is not None:
            return Claim(key, lease_id, inserted)
        # the row and the database's "now" in one statement: every comparison below is on its clock
        row = conn.execute(
            sa.select(table, now.label("database_now")).where(where_key).with_for_update()
        ).one_or_none()
        if row is None:
            # Deleted between our INSERT and our read (cleanup, a retryable fail): try again.
            continue
        if row.lease_id == lease_id:
            return Claim(key, lease_id, row.lease_expires_at)  # MySQL: our INSERT created it
        if row.expires_at <= row.database_now:
            # An expired record counts as absent; the row lock we hold makes the reset safe.
            reset = conn.execute(sa.update(table).where(where_key, table.c.expires_at <= now).values(fresh))
            if reset.rowcount == 1:
                return Claim(key, lease_id, _lease_end(conn, table, key))
            continue
        if row.fingerprint is not None and fingerprint is not None and row.fingerprint != fingerprint:
            raise FingerprintMismatch(f"key {key!r} was first used for a different request", key=key)
        if row.status == SUCCEEDED:
            return Replay(key, _stored_response(row))
        if row.status == FAILED:
            error = json.loads(row.error) if row.error else None
            raise RecordFailed(f"key {key!r} failed for good", key=key, error=error)
        if row.lease_expires_at is not None and row.lease_expires_at > row.database_now:
            retry_after = max(1, math.ceil((row.lease_expires_at - row.database_now).total_seconds()))
            raise RecordInProgress(
                f"key {key!r} is being processed by another request", key=key, retry_after_seconds=retry_after
            )
        # PROCESSING with a dead lease: the holder crashed after committing its claim. Take over,
        # fenced by the old lease id so that exactly one of several takers wins, and only while
        # the database's clock still says the lease is over.
        taken = conn.execute(
            sa.update(table)
            .where(
                where_key,
                table.c.status == PROCESSING,
                table.c.lease_id == row.lease_id,
                table.c.lease_expires_at <= now,
            )
            .values(lease_id=lease_id, lease_expires_at=lease_expires_at, updated_at=now)
        )
        if taken.rowcount == 1:
            return Claim(key, lease_id, _lease_end(conn, table, key), taken_over=True)
    raise RecordInProgress(f"key {key!r} keeps changing under us; retry", key=key)


def _lease_end(conn: Connection, table: sa.Table, key: str) -> datetime:
    """The lease end the database just wrote (an UPDATE cannot return it on MySQL/MariaDB)."""
    ends: datetime = conn.execute(
        sa.select(table.c.lease_expires_at).where(table.c.record_key == key)
    ).scalar_one()
    return ends


def _settle(
    conn: Connection,
    table: sa.Table,
    claimed: Claim,
    what: str,
    values: dict[str, Any] | None,
    clock: Clock | None,
) -> None:
    """End the claim, in the caller's transaction: the record takes ``values`` and loses its lease,
    or is deleted (``None``). Fenced by the lease id: a claim taken over raises ``LeaseLost``."""
    _require_transaction(conn)
    key = table.c.record_key == claimed.key
    fenced = (key, table.c.status == PROCESSING, table.c.lease_id == claimed.lease_id)
    statement: Any = sa.delete(table).where(*fenced)
    if values is not None:
        now = database_now(conn.dialect.name, clock=clock)
        ended = {"lease_id": None, "lease_expires_at": None, "updated_at": now, **values}
        statement = sa.update(table).where(*fenced).values(ended)
    if conn.execute(statement).rowcount != 1:
        raise LeaseLost(f"the lease on key {claimed.key!r} was taken over; the {what} was not stored")


def complete(
    conn: Connection,
    claimed: Claim,
    response: StoredResponse,
    *,
    table: sa.Table = IDEMPOTENCY_RECORDS,
    clock: Clock | None = None,
) -> None:
    """Mark the claimed record SUCCEEDED with ``response`` (in the transaction of the business writes)."""
    if not isinstance(response, StoredResponse):
        raise TypeError(f"store a StoredResponse, not {type(response).__name__}")
    outcome = {
        "status": SUCCEEDED,
        "response_status": response.status,
        "response_headers": response.headers_json(),
        "response_body": response.body,
    }
    _settle(conn, table, claimed, "outcome", outcome, clock)


def fail(
    conn: Connection,
    claimed: Claim,
    *,
    retryable: bool,
    error: Any = None,
    table: sa.Table = IDEMPOTENCY_RECORDS,
    clock: Clock | None = None,
) -> None:
    """Give the key up: delete the record (``retryable``: the key is free again) or mark it FAILED
    with ``error`` (JSON)."""
    failure = None if retryable else {"status": FAILED, "error": json.dumps(error, separators=(",", ":"))}
    _settle(conn, table, claimed, "failure", failure, clock)


class RunOptions(TypedDict, total=False):
    """:func:`run_once`'s options, which :func:`run_once_for_token` passes on."""

    fingerprint: str | None
    ttl_seconds: int
    table: sa.Table
    clock: Clock | None
    telemetry: Telemetry | None
    telemetry_scope: str


def run_once(
    conn: Connection,
    key: str,
    handler: Callable[[Connection], StoredResponse],
    *,
    fingerprint: str | None = None,
    ttl_seconds: int = DEFAULT_RECORD_TTL_SECONDS,
    table: sa.Table = IDEMPOTENCY_RECORDS,
    clock: Clock | None = None,
    telemetry: Telemetry | None = None,
    telemetry_scope: str = "durable",
) -> Outcome:
    """Run ``handler(conn)`` at most once per ``key``, in the caller's transaction (docs/durable.md).

    The first call claims the key, runs the handler and stores the response it returns, all
    committed with the caller's transaction; if anything in it raises, neither the record nor the
    business writes are left, and the request may be retried. Later calls get
    ``Outcome(response, replayed=True)`` without running the handler. ``telemetry`` counts and
    traces it as the guards do (scope ``telemetry_scope``; a ``token_service.durable`` span,
    current while the handler runs); an execution counts once its record is written.
    """
    # the guards' bookkeeping (what is counted, how the span ends); the store is this module's SQL
    run = GuardEngine[Any](None, "", telemetry_scope, request_id="-", telemetry=telemetry)
    span = run._span = run.telemetry.start_span(telemetry_scope, name=DURABLE_SPAN_NAME)
    try:
        claimed = claim(conn, key, fingerprint=fingerprint, ttl_seconds=ttl_seconds, table=table, clock=clock)
    except FingerprintMismatch:
        run._settled("mismatch")
        run.telemetry.count("mismatches", telemetry_scope, field="fingerprint")
        raise
    except (RecordInProgress, RecordFailed) as exc:
        run._settled("conflict")
        run.telemetry.count("conflicts", telemetry_scope, code=exc.code)
        raise
    except BaseException as exc:
        run._settled("error", exc)
        raise
    if isinstance(claimed, Replay):
        run._settled("replayed")
        run.telemetry.count("replays", telemetry_scope)
        return Outcome(claimed.response, replayed=True)
    try:
        with span.current():
            response = handler(conn)
    except BaseException as exc:
        run._executed("released", exc)  # the transaction rolls back: no record, no business writes
        raise
    try:
        complete(conn, claimed, response, table=table, clock=clock)
    except LeaseLost as lost:
        run._complete_refused(lost)  # reported and counted as a guard's lost lease is
        raise
    except BaseException as exc:
        run._settled("error", exc)
        raise
    run._executed("succeeded")
    return Outcome(response, replayed=False)


def run_once_for_token(
    conn: Connection,
    token: str,
    handler: Callable[[Connection], StoredResponse],
    *,
    replay: bool = True,
    **options: Unpack[RunOptions],
) -> Outcome:
    """``run_once`` keyed by the token's digest: the database backstop behind Redis.

    Should Redis forget that the token was used and let it through again, the record refuses the
    second execution: the stored response is replayed, or with ``replay=False`` ``TokenUsed`` is
    raised, as a one-shot consume would have.
    """
    outcome = run_once(conn, token_record_key(token), handler, **options)
    if outcome.replayed and not replay:
        raise TokenUsed("this token's operation already ran (database record)")
    return outcome


# help() and inspect list run_once's options by name with their defaults (RunOptions hides them)
_signature = inspect.signature(run_once_for_token)
run_once_for_token.__signature__ = _signature.replace(  # type: ignore[attr-defined]
    parameters=[
        *list(_signature.parameters.values())[:-1],
        *(p for p in inspect.signature(run_once).parameters.values() if p.kind is p.KEYWORD_ONLY),
    ]
)


# SQLSTATEs (PostgreSQL, and MySQL's 40001 for a deadlock) and MySQL error numbers after
# which the database has rolled the whole transaction back and asks for it to be run again.
_RETRY_SQLSTATES = frozenset({"40001", "40P01"})
_RETRY_MYSQL_ERRORS = frozenset({1213})  # ER_LOCK_DEADLOCK


def is_retryable(exc: BaseException) -> bool:
    """True for a deadlock or serialization failure: the transaction was rolled back; run it again."""
    if not isinstance(exc, sa.exc.DBAPIError):
        return False
    orig = exc.orig
    if getattr(orig, "sqlstate", None) in _RETRY_SQLSTATES:
        return True
    args: tuple[Any, ...] = tuple(getattr(orig, "args", ()))
    return len(args) > 0 and args[0] in _RETRY_MYSQL_ERRORS


def retry_transaction(
    engine: sa.Engine,
    work: Callable[[Connection], _T],
    *,
    attempts: int = 5,
    backoff_seconds: float = 0.05,
) -> _T:
    """Run ``work(conn)`` in ``engine.begin()``, again if the database reports a deadlock or a
    serialization failure (InnoDB waiters on a key whose holder rolled back, PostgreSQL's
    REPEATABLE READ / SERIALIZABLE): it undid the whole transaction, guard included, so running
    it again is safe, and usually replays the winner's response."""
    for attempt in range(1, attempts + 1):
        try:
            with engine.begin() as conn:
                return work(conn)
        except sa.exc.DBAPIError as exc:
            if attempt == attempts or not is_retryable(exc):
                raise
            time.sleep(backoff_seconds * attempt * (0.5 + random.random()))
    raise AssertionError("unreachable")  # pragma: no cover
