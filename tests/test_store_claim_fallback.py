"""A keyed claim on a Redis older than 7.0 (which refuses ``SET ... NX GET`` as a syntax error)
falls back to begin.lua, from then on, and claims all the same; any other error of the plain
SET is the store's (ServiceUnavailable when Redis cannot answer; a bug of ours raised as it is).

Redis here is 7.x: the refusal 6.2 answers is made by the test, on a real redis-server.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
import redis.asyncio
from redis import exceptions as redis_errors

from tests.support.processes import RedisServer
from token_service import records
from token_service.errors import ServiceUnavailable
from token_service.records import UseRequest
from token_service.store import AsyncTokenStore, TokenStore

SCOPE = "report.build"
REDIS_6_REFUSAL = "ERR syntax error"


def _use(key: str) -> UseRequest:
    return UseRequest(key, SCOPE, None, "fp-1", None)


def test_a_claim_on_redis_6_falls_back_to_begin_lua_from_then_on(real_redis: redis.Redis) -> None:
    store = TokenStore(real_redis)
    sets: list[tuple[Any, ...]] = []
    send = store._execute

    def as_redis_6(command: tuple[Any, ...], **options: Any) -> Any:
        if command[0] == "SET" and "NX" in command and "GET" in command:
            sets.append(command)
            raise redis_errors.ResponseError(REDIS_6_REFUSAL)
        return send(command, **options)

    store._execute = as_redis_6  # type: ignore[method-assign]
    first = store.begin(_use("op-1"), 30, claim_ttl_seconds=60)
    assert isinstance(first, records.Started)
    assert store.complete("op-1", first.lease_id, {"done": 1}) == records.Completed(replayed=False)
    second = store.begin(_use("op-2"), 30, claim_ttl_seconds=60)
    assert isinstance(second, records.Started)
    assert len(sets) == 1  # refused once: begin.lua claims from then on
    replay = store.begin(_use("op-1"), 30, claim_ttl_seconds=60)
    assert isinstance(replay, records.Finished)
    assert replay.result == {"done": 1}


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        (redis_errors.ConnectionError("refused"), ServiceUnavailable),
        (redis_errors.DataError("a bug of ours: an argument redis-py refuses"), None),
    ],
)
def test_another_error_of_the_plain_claim_is_the_stores(
    real_redis: redis.Redis, error: Exception, raised: type[Exception] | None
) -> None:
    store = TokenStore(real_redis)

    def failing(command: tuple[Any, ...], **options: Any) -> Any:
        raise error

    store._execute = failing  # type: ignore[method-assign]
    with pytest.raises(raised or type(error)) as caught:
        store.begin(_use("op-1"), 30, claim_ttl_seconds=60)
    if raised is None:
        assert caught.value is error
    else:
        assert caught.value.__cause__ is error
    assert store._plain_claim  # nothing said this Redis is older than 7.0


async def test_an_async_claim_on_redis_6_falls_back_to_begin_lua(redis_server: RedisServer) -> None:
    client = redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port)
    await client.flushall()
    store = AsyncTokenStore(client)
    refused: list[tuple[Any, ...]] = []
    send = client.execute_command

    async def as_redis_6(*command: Any, **options: Any) -> Any:
        if command[0] == "SET" and "NX" in command and "GET" in command:
            refused.append(command)
            raise redis_errors.ResponseError(REDIS_6_REFUSAL)
        return await send(*command, **options)

    client.execute_command = as_redis_6  # type: ignore[method-assign]
    try:
        first = await store.begin(_use("op-1"), 30, claim_ttl_seconds=60)
        assert isinstance(first, records.Started)
        second = await store.begin(_use("op-2"), 30, claim_ttl_seconds=60)
        assert isinstance(second, records.Started)
        assert len(refused) == 1
        assert not store._plain_claim
    finally:
        await client.flushall()
        await client.aclose()
