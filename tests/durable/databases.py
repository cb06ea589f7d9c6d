"""The databases the durable tests run on, and the tables they create (importable by child processes).

PostgreSQL and MariaDB are the machine's servers (URLs overridable with
TOKEN_SERVICE_TEST_POSTGRES_URL / TOKEN_SERVICE_TEST_MYSQL_URL); every test
creates its own uniquely named tables and drops them afterwards. SQLite is a
file in the test's tmp dir, so several processes can share it. A server that
is down skips its tests with the reason — except under CI, where it fails the
run, because CI on this machine kind has both servers.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field

import pytest
import sqlalchemy as sa

from token_service.client.durable import records_table

SERVER_URLS = {
    "postgresql": os.environ.get(
        "TOKEN_SERVICE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    ),
    "mariadb": os.environ.get("TOKEN_SERVICE_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test"),
}
CONNECT_TIMEOUT_SECONDS = 5


def make_engine(url: str) -> sa.Engine:
    if url.startswith("sqlite"):
        # Writers wait for each other (SQLite has one write lock per database) instead of failing.
        return sa.create_engine(url, connect_args={"timeout": 60})
    # Pooled: a MariaDB connect costs ~0.1 s here, a pooled checkout nothing.
    return sa.create_engine(url, connect_args={"connect_timeout": CONNECT_TIMEOUT_SECONDS})


def unavailable(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} — CI must run the durable tests against it", pytrace=False)
    pytest.skip(what)


_unreachable: dict[str, str | None] = {}


def check_reachable(name: str, url: str) -> None:
    """Skip (or, under CI, fail) unless the server answers; asked once per session, never hangs."""
    if url not in _unreachable:
        _unreachable[url] = None
        try:
            engine = make_engine(url)
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
            engine.dispose()
        except (sa.exc.OperationalError, sa.exc.InterfaceError, ImportError) as exc:
            reason = getattr(exc, "orig", None) or exc
            shown = sa.engine.make_url(url).render_as_string(hide_password=True)
            _unreachable[url] = f"{name} at {shown} is not reachable: {reason}"
    if _unreachable[url]:
        unavailable(str(_unreachable[url]))


def payments_table(name: str, metadata: sa.MetaData) -> sa.Table:
    """The business table of the tests: one row per executed charge."""
    return sa.Table(
        name,
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("order_id", sa.String(64), nullable=False),
        sa.Column("amount_cents", sa.Integer, nullable=False),
        sa.Column("executed_by", sa.String(64), nullable=False),
    )


def orders_table(name: str, metadata: sa.MetaData) -> sa.Table:
    return sa.Table(
        name,
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("version", sa.Integer, nullable=False, server_default="0"),
        sa.Column("note", sa.String(64), nullable=True),
    )


@dataclass
class Tables:
    """Table names for one test; ``bind`` builds the Table objects (also in a child process)."""

    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:10])

    def bind(self) -> tuple[sa.MetaData, sa.Table, sa.Table, sa.Table]:
        metadata = sa.MetaData()
        records = records_table(f"ts_rec_{self.suffix}", metadata)
        payments = payments_table(f"ts_pay_{self.suffix}", metadata)
        orders = orders_table(f"ts_ord_{self.suffix}", metadata)
        return metadata, records, payments, orders


@dataclass
class Db:
    """One database for one test, with freshly created tables."""

    name: str
    url: str
    engine: sa.Engine
    tables: Tables
    metadata: sa.MetaData
    records: sa.Table
    payments: sa.Table
    orders: sa.Table

    def count(self, table: sa.Table) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())

    def record(self, key: str) -> sa.Row | None:  # type: ignore[type-arg]
        with self.engine.connect() as conn:
            return conn.execute(sa.select(self.records).where(self.records.c.record_key == key)).one_or_none()

    def lock_waiters(self) -> int | None:
        """Sessions blocked on a lock in a statement on this test's records table (None on SQLite,
        which has no view of its waiters): what a test waits for before it asserts that they wait."""
        if self.name == "postgresql":
            sql = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE :table"
        elif self.name == "mariadb":
            # Not innodb_trx: MariaDB 10.11 lists only the holder there while the others wait.
            # The process list shows them as statements still running on the table (the
            # holder sits idle in its transaction; this query itself names the table too).
            sql = (
                "SELECT count(*) FROM information_schema.processlist"
                " WHERE command = 'Query' AND info LIKE :table AND id <> CONNECTION_ID()"
            )
        else:
            return None
        with self.engine.connect() as conn:
            return int(conn.execute(sa.text(sql), {"table": f"%{self.records.name}%"}).scalar_one())
