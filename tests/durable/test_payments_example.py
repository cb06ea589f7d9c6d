"""The payment endpoint of docs/durable.md (examples/payments.py), run against real Redis and a real database.

docs/durable.md's SQL blocks are checked by tests/durable/test_schema.py."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from examples import payments as example
from tests.durable.databases import SERVER_URLS, check_reachable, make_engine
from tests.support.docs import code_blocks
from token_service.client import TokenClient
from token_service.tokens import record_key

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_show_the_example_verbatim() -> None:
    [shown] = [
        block.code.removeprefix("# examples/payments.py\n")
        for block in code_blocks("docs/durable.md", "python")
        if block.code.startswith("# examples/payments.py\n")
    ]
    assert shown == ROOT.joinpath("examples", "payments.py").read_text()


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    if request.param == "sqlite":
        engine = make_engine(f"sqlite:///{tmp_path / 'shop.sqlite'}")
        yield engine
        engine.dispose()
        return
    check_reachable("postgresql", SERVER_URLS["postgresql"])
    base = make_engine(SERVER_URLS["postgresql"])
    schema = f"ts_example_{uuid.uuid4().hex[:10]}"
    with base.begin() as conn:
        conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
    try:
        # the example's tables have fixed names; a schema of our own keeps them apart
        yield base.execution_options(schema_translate_map={None: schema})
    finally:
        with base.begin() as conn:
            conn.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
        base.dispose()


def charged(engine: sa.Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(sa.select(example.payments.c.order_id))]


def test_payment_endpoint_charges_once_even_when_redis_forgets(
    engine: sa.Engine, real_redis: redis.Redis
) -> None:
    tokens = TokenClient.from_redis(real_redis)
    client = example.create_app(engine, tokens).test_client()
    token = tokens.generate("payment.create").token
    issued = real_redis.dump(record_key("ts:", token))
    assert issued is not None
    order = {"order_id": "order-42", "amount_cents": 1999}
    headers = {"Idempotency-Token": token}

    first = client.post("/payments", json=order, headers=headers)
    assert first.status_code == 201
    assert "Idempotent-Replayed" not in first.headers
    assert first.get_json()["order_id"] == "order-42"

    # A double click: Redis knows the token and replays.
    again = client.post("/payments", json=order, headers=headers)
    assert (again.status_code, again.data) == (201, first.data)
    assert again.headers["Idempotent-Replayed"] == "true"

    # Failover to a replica that never saw the payment: the token is ISSUED again in Redis.
    real_redis.flushall()
    real_redis.restore(record_key("ts:", token), 300_000, issued)
    after_failover = client.post("/payments", json=order, headers=headers)
    assert (after_failover.status_code, after_failover.data) == (201, first.data)
    assert after_failover.headers["Idempotent-Replayed"] == "true"
    assert charged(engine) == [("order-42",)]

    # The same token for another amount: the database refuses (Redis was told nothing about amounts).
    real_redis.flushall()
    real_redis.restore(record_key("ts:", token), 300_000, issued)
    tampered = client.post("/payments", json={**order, "amount_cents": 1}, headers=headers)
    assert tampered.status_code == 422
    assert tampered.content_type == "application/problem+json"
    assert tampered.get_json()["code"] == "fingerprint_mismatch"

    # A malformed order is refused with problem+json, not a 500.
    other = tokens.generate("payment.create").token
    bad = client.post("/payments", json={"order_id": 7}, headers={"Idempotency-Token": other})
    assert (bad.status_code, bad.get_json()["code"]) == (400, "invalid_request")

    # Without a token, nothing runs.
    assert client.post("/payments", json=order).status_code == 400
    assert charged(engine) == [("order-42",)]


def test_concurrent_double_clicks_charge_once(engine: sa.Engine, real_redis: redis.Redis) -> None:
    tokens = TokenClient.from_redis(real_redis)
    app = example.create_app(engine, tokens)
    token = tokens.generate("payment.create").token
    clicks = 4
    barrier = threading.Barrier(clicks)
    answers: list[tuple[int, bytes]] = []

    def click() -> None:
        client = app.test_client()
        barrier.wait(timeout=30)
        response = client.post(
            "/payments",
            json={"order_id": "order-7", "amount_cents": 500},
            headers={"Idempotency-Token": token},
        )
        answers.append((response.status_code, response.data))

    threads = [threading.Thread(target=click) for _ in range(clicks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(answers) == clicks
    assert charged(engine) == [("order-7",)]
    winners = [data for status, data in answers if status == 201]
    assert winners
    assert len(set(winners)) == 1  # every 201 is the same payment
    # the others were told the first click is still in progress
    assert all(status in (201, 409) for status, _ in answers)


def test_main_needs_the_token_services_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOKEN_SERVICE_REDIS_URL", raising=False)
    with pytest.raises(SystemExit, match="TOKEN_SERVICE_REDIS_URL"):
        example.main()


def test_main_takes_redis_and_the_database_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, redis_server: Any, tmp_path: Path
) -> None:
    from flask import Flask

    ran: list[dict[str, Any]] = []
    monkeypatch.setattr(Flask, "run", lambda self, **options: ran.append(options))
    monkeypatch.setenv("TOKEN_SERVICE_REDIS_URL", redis_server.url)
    monkeypatch.setenv("PAYMENTS_DATABASE_URL", f"sqlite:///{tmp_path / 'shop.sqlite'}")
    example.main()
    assert ran == [{"port": 5000}]
    assert (tmp_path / "shop.sqlite").is_file()  # the tables were made in that database
