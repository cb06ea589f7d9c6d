"""The database backstop behind the token: Redis forgets a consumed token, the record still refuses."""

from __future__ import annotations

import pytest
import redis
import sqlalchemy as sa

from tests.durable.databases import Db
from tests.durable.workers import charge
from token_service.client.durable import run_once_for_token, token_record_key
from token_service.errors import TokenInvalid, TokenUsed
from token_service.records import IssueRequest, UseRequest
from token_service.store import TokenStore
from token_service.tokens import token_digest

SCOPE = "payment.create"


def test_the_record_key_is_the_token_digest_never_the_token() -> None:
    token = "A" * 43
    assert token_record_key(token) == f"token:{token_digest(token)}"
    assert token not in token_record_key(token)
    with pytest.raises(TokenInvalid):
        token_record_key("not a token!")


def test_database_refuses_a_second_execution_after_redis_forgets_the_consumed_token(
    db: Db, real_redis: redis.Redis
) -> None:
    store = TokenStore(real_redis)
    [token] = store.issue(IssueRequest(SCOPE, subject="alice", fingerprint=None, ttl_seconds=300))
    redis_key = store.key(token)
    # What a replica that missed the consume would hold: the ISSUED record.
    issued_snapshot = real_redis.dump(redis_key)
    assert issued_snapshot is not None

    store.consume(UseRequest(token, SCOPE, subject="alice"))
    with db.engine.begin() as conn:
        first = run_once_for_token(
            conn, token, charge(db.payments, "order-9", 4200, "first"), table=db.records
        )
    assert first.replayed is False

    # Failover: the new primary never saw the consume. Redis is flushed and holds the
    # ISSUED record again, so Redis alone would let the token through a second time.
    real_redis.flushall()
    real_redis.restore(redis_key, 300_000, issued_snapshot)
    store.consume(UseRequest(token, SCOPE, subject="alice"))  # Redis says: go ahead

    with db.engine.begin() as conn:
        second = run_once_for_token(
            conn, token, charge(db.payments, "order-9", 4200, "second"), table=db.records
        )
    assert second.replayed is True
    assert second.response.body == first.response.body
    with pytest.raises(TokenUsed), db.engine.begin() as conn:
        run_once_for_token(
            conn, token, charge(db.payments, "order-9", 4200, "third"), replay=False, table=db.records
        )
    assert db.count(db.payments) == 1

    # Only the digest is at rest in the database.
    with db.engine.connect() as conn:
        rows = [tuple(row) for row in conn.execute(sa.select(db.records))]
    assert [row[0] for row in rows] == [token_record_key(token)]
    assert token not in repr(rows)


def test_help_shows_run_once_for_token_options_by_name_with_their_defaults() -> None:
    # run_once's options are passed on as **options (RunOptions, e6ea5c3): help() and inspect
    # still list each of them by keyword, with run_once's default, as the signature did before
    import inspect

    from token_service.client.durable import run_once

    shown = inspect.signature(run_once_for_token).parameters
    shared = {
        name: parameter.default
        for name, parameter in inspect.signature(run_once).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert set(shared) == {"fingerprint", "ttl_seconds", "table", "clock", "telemetry", "telemetry_scope"}
    assert [name for name in shown] == ["conn", "token", "handler", "replay", *shared]
    for name, default in shared.items():
        assert shown[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert shown[name].default is default
