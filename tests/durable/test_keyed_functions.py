"""@idempotent(durable=engine): the key also recorded in the database, with the function's own writes.

SQLite, PostgreSQL and MariaDB (the ``db`` fixture), Redis a real redis-server.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from tests.durable.databases import Db
from token_service.client import TokenClient, idempotent

pytestmark = pytest.mark.real


class Declined(Exception):
    pass


@pytest.fixture
def tokens(real_redis: redis.Redis) -> Iterator[TokenClient]:
    with TokenClient.from_redis(real_redis) as client:
        yield client


def charger(tokens: TokenClient, db: Db, calls: list[str]) -> Any:
    @idempotent(tokens, "order.charge", key="order_id", durable=db.engine, durable_table=db.records)
    def charge(order_id: str, amount_cents: int, *, conn: sa.Connection) -> dict[str, Any]:
        calls.append(order_id)
        if amount_cents < 0:
            raise Declined("negative")
        conn.execute(
            sa.insert(db.payments).values(order_id=order_id, amount_cents=amount_cents, executed_by="test")
        )
        return {"order": order_id, "charged": amount_cents}

    return charge


def test_the_record_and_the_writes_commit_together(tokens: TokenClient, db: Db) -> None:
    calls: list[str] = []
    charge = charger(tokens, db, calls)
    assert charge("o-1", 1250) == {"order": "o-1", "charged": 1250}
    assert charge("o-1", 1250) == {"order": "o-1", "charged": 1250}
    assert calls == ["o-1"]
    assert db.count(db.payments) == 1
    assert db.count(db.records) == 1


def test_when_redis_forgets_the_database_refuses_a_second_execution(
    tokens: TokenClient, db: Db, real_redis: redis.Redis
) -> None:
    calls: list[str] = []
    charge = charger(tokens, db, calls)
    charge("o-2", 500)
    real_redis.flushall()  # a failover to a replica that never got the write
    assert charge("o-2", 500) == {"order": "o-2", "charged": 500}  # the database's stored result
    assert calls == ["o-2"]
    assert db.count(db.payments) == 1
    assert charge("o-2", 500) == {"order": "o-2", "charged": 500}  # and Redis knows again
    assert calls == ["o-2"]


def test_a_failure_rolls_back_the_writes_and_frees_the_key(tokens: TokenClient, db: Db) -> None:
    calls: list[str] = []
    charge = charger(tokens, db, calls)
    with pytest.raises(Declined):
        charge("o-3", -1)
    assert db.count(db.records) == 0
    assert db.count(db.payments) == 0
    assert charge("o-3", 700) == {"order": "o-3", "charged": 700}  # the retry runs
    assert calls == ["o-3", "o-3"]


def test_durable_needs_a_conn_parameter_and_a_sync_function(tokens: TokenClient, db: Db) -> None:
    with pytest.raises(TypeError, match="conn"):
        idempotent(tokens, "a.b", key="x", durable=db.engine)(lambda x: x)
