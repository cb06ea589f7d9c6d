"""The record table's DDL: the docs show exactly what SQLAlchemy generates, and it runs on each database."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.durable.databases import Db
from tests.durable.workers import charge
from token_service.client.durable import create_records_table, ddl, records_table, run_once
from token_service.client.durable._schema import DIALECTS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "durable.md"
_BLOCK = re.compile(r"```sql\n-- dialect: (\w+)\n(.*?)```", re.DOTALL)


def documented_ddl() -> dict[str, str]:
    return dict(_BLOCK.findall(DOCS.read_text()))


def test_the_docs_show_the_generated_ddl_for_every_dialect() -> None:
    documented = documented_ddl()
    assert set(documented) == set(DIALECTS) == {"postgresql", "mysql", "sqlite"}
    for dialect, sql in documented.items():
        assert sql == ddl(dialect), f"docs/durable.md is stale for {dialect}: paste ddl({dialect!r})"


def test_the_documented_sql_creates_a_table_the_guard_works_on(db: Db) -> None:
    dialect = "mysql" if db.engine.dialect.name in ("mysql", "mariadb") else db.engine.dialect.name
    name = f"ts_doc_{uuid.uuid4().hex[:10]}"
    sql = documented_ddl()[dialect].replace("idempotency_records", name)
    table = records_table(name)
    try:
        with db.engine.begin() as conn:
            for statement in sql.split(";\n"):
                if statement.strip():
                    conn.execute(sa.text(statement))
        for who in ("first", "second"):
            with db.engine.begin() as conn:
                outcome = run_once(conn, "doc-key", charge(db.payments, "o", 1, who), table=table)
        assert outcome.replayed
        assert db.count(db.payments) == 1
        with db.engine.connect() as conn, pytest.raises(sa.exc.DBAPIError, match=f"ck_{name}_status"):
            # the CHECK constraint holds the statuses to the three the guard knows
            conn.execute(sa.update(table).where(table.c.record_key == "doc-key").values(status="DONE"))
    finally:
        table.drop(db.engine, checkfirst=True)


def test_create_records_table_is_idempotent(db: Db) -> None:
    table = records_table(f"ts_new_{uuid.uuid4().hex[:10]}")
    try:
        create_records_table(db.engine, table)
        create_records_table(db.engine, table)
        assert sa.inspect(db.engine).has_table(table.name)
    finally:
        table.drop(db.engine, checkfirst=True)
