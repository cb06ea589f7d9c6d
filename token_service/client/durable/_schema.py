"""The idempotency record table, its DDL per database, and ``create_records_table``.

Times are naive UTC everywhere (the three databases agree on nothing else), written by the
database's own clock (``database_now``). MySQL/MariaDB compare strings case- and
trailing-space-insensitively by default, and two token digests that differ only in case would
share a record (one caller handed another's response): there the key is ``ascii_bin``, and keys
are visible ASCII (``check_key``).
"""

from __future__ import annotations

import re
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.schema import CreateIndex, CreateTable

__all__ = [
    "DIALECTS",
    "FAILED",
    "IDEMPOTENCY_RECORDS",
    "PROCESSING",
    "SUCCEEDED",
    "check_fingerprint",
    "check_key",
    "create_records_table",
    "ddl",
    "records_table",
]

PROCESSING = "PROCESSING"
SUCCEEDED = "SUCCEEDED"
FAILED = "FAILED"

DEFAULT_TABLE_NAME = "idempotency_records"
MAX_KEY_CHARS = 255
MAX_FINGERPRINT_CHARS = 128
_KEY_RE = re.compile(r"[\x21-\x7e]{1,255}\Z")

_MYSQL = ("mysql", "mariadb")


def _ascii(length: int) -> sa.types.TypeEngine[str]:
    return sa.String(length).with_variant(
        mysql.VARCHAR(length, charset="ascii", collation="ascii_bin"), *_MYSQL
    )


def _datetime() -> sa.types.TypeEngine[datetime]:
    # MySQL's DATETIME rounds to whole seconds unless told to keep microseconds.
    return sa.DateTime().with_variant(mysql.DATETIME(fsp=6), *_MYSQL)


def records_table(
    name: str = DEFAULT_TABLE_NAME, metadata: sa.MetaData | None = None, schema: str | None = None
) -> sa.Table:
    """The record table as a SQLAlchemy Core ``Table`` (name and schema are yours to choose)."""
    return sa.Table(
        name,
        metadata if metadata is not None else sa.MetaData(),
        sa.Column("record_key", _ascii(MAX_KEY_CHARS), primary_key=True),
        sa.Column("status", _ascii(16), nullable=False),
        sa.Column("fingerprint", _ascii(MAX_FINGERPRINT_CHARS), nullable=True),
        sa.Column("lease_id", _ascii(64), nullable=True),
        sa.Column("lease_expires_at", _datetime(), nullable=True),
        sa.Column("response_status", sa.Integer(), nullable=True),
        sa.Column("response_headers", sa.Text(), nullable=True),
        sa.Column(
            "response_body",
            sa.LargeBinary().with_variant(mysql.MEDIUMBLOB(), *_MYSQL),
            nullable=True,
        ),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", _datetime(), nullable=False),
        sa.Column("updated_at", _datetime(), nullable=False),
        sa.Column("expires_at", _datetime(), nullable=False),
        sa.CheckConstraint("status IN ('PROCESSING', 'SUCCEEDED', 'FAILED')", name=f"ck_{name}_status"),
        sa.Index(f"ix_{name}_expires_at", "expires_at"),
        schema=schema,
        # the guard is only as good as the transactions around it
        mysql_engine="InnoDB",
    )


IDEMPOTENCY_RECORDS = records_table()

DIALECTS: dict[str, Dialect] = {
    "postgresql": postgresql.dialect(),  # type: ignore[no-untyped-call]
    "mysql": mysql.dialect(),
    "sqlite": sqlite.dialect(),
}


def ddl(dialect: str | Dialect, table: sa.Table = IDEMPOTENCY_RECORDS) -> str:
    """The plain SQL that creates ``table`` (``postgresql``, ``mysql`` — also MariaDB — or ``sqlite``)."""
    compiled_for = DIALECTS[dialect] if isinstance(dialect, str) else dialect
    statements = [str(CreateTable(table).compile(dialect=compiled_for)).strip()]
    statements += [str(CreateIndex(index).compile(dialect=compiled_for)).strip() for index in table.indexes]
    # SQLAlchemy indents with tabs and leaves trailing spaces; docs and diffs want neither.
    text = "".join(statement + ";\n" for statement in statements)
    return "\n".join(line.rstrip().replace("\t", "    ") for line in text.split("\n"))


def create_records_table(bind: Engine | Connection, table: sa.Table = IDEMPOTENCY_RECORDS) -> None:
    """CREATE TABLE (and its index) if it does not exist yet."""
    table.create(bind, checkfirst=True)


def check_key(key: str) -> None:
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise ValueError(
            f"an idempotency record key is 1..{MAX_KEY_CHARS} visible ASCII characters "
            "(no spaces); hash longer or other keys first"
        )


def check_fingerprint(fingerprint: str | None) -> None:
    if fingerprint is not None and (
        not isinstance(fingerprint, str) or not _KEY_RE.match(fingerprint) or len(fingerprint) > 128
    ):
        raise ValueError(
            f"a fingerprint is 1..{MAX_FINGERPRINT_CHARS} visible ASCII characters; "
            "use request_fingerprint() to make one"
        )
