"""Fixtures of the durable backstop tests: ``db`` runs a test on SQLite, PostgreSQL and MariaDB.

Creating tables costs up to a second on a busy MariaDB, so each database gets
its uniquely named tables once per session (dropped at the end) and every
test starts from empty tables.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.durable.databases import SERVER_URLS, Db, Tables, check_reachable, make_engine


@pytest.fixture(scope="session")
def databases() -> Iterator[dict[str, Db]]:
    opened: dict[str, Db] = {}
    yield opened
    for db in opened.values():
        db.metadata.drop_all(db.engine)
        db.engine.dispose()


def open_db(name: str, url: str) -> Db:
    engine = make_engine(url)
    tables = Tables()
    metadata, records, payments, orders = tables.bind()
    metadata.create_all(engine)
    return Db(name, url, engine, tables, metadata, records, payments, orders)


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def db(
    request: pytest.FixtureRequest, databases: dict[str, Db], tmp_path_factory: pytest.TempPathFactory
) -> Db:
    name = request.param
    if name not in databases:
        if name == "sqlite":
            url = f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'durable.sqlite'}"
        else:
            url = SERVER_URLS[name]
            check_reachable(name, url)
        databases[name] = open_db(name, url)
    db = databases[name]
    with db.engine.begin() as conn:
        for table in (db.records, db.payments, db.orders):
            conn.execute(sa.delete(table))
    return db
