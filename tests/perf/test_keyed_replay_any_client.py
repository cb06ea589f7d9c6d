"""A keyed replay is one command on every kind of client, not only a plain ``redis.Redis``.

The plain claim's ``SET … NX GET`` returns the record it found; redis-py's parser of
SET's reply hands it over only when told ``get=True`` (else it answers whether the
reply was "OK": False). A client whose commands go through ``execute_command`` (a
single-connection client, Cluster, Sentinel, redis.asyncio, fakeredis) then sent
every keyed replay on to begin.lua: two round trips, the outcome still right.
Counted with MONITOR as tests/perf/test_round_trips.py counts.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
import redis.asyncio

from tests.perf.test_round_trips import command_names, commands_sent
from tests.support.processes import RedisServer
from token_service.records import Finished, Started, UseRequest
from token_service.store import AsyncTokenStore, TokenStore

pytestmark = pytest.mark.real

USE = UseRequest("op:order-7", "order.ship")


def test_a_keyed_replay_on_a_single_connection_client_is_one_set(
    redis_server: RedisServer, real_redis: redis.Redis
) -> None:
    client = redis.Redis(port=redis_server.port, single_connection_client=True)
    store = TokenStore(client)
    started = store.begin(USE, 30, 60)
    assert isinstance(started, Started)
    store.complete(USE.token, started.lease_id, {"shipped": 7})
    with commands_sent(redis_server) as seen:
        replay = store.begin(USE, 30, 60)
    client.close()
    assert replay == Finished(result={"shipped": 7})
    assert command_names(seen) == ["SET"]


async def test_an_async_keyed_replay_is_one_set(redis_server: RedisServer, real_redis: redis.Redis) -> None:
    client: Any = redis.asyncio.Redis(port=redis_server.port)
    store = AsyncTokenStore(client)
    started = await store.begin(USE, 30, 60)
    assert isinstance(started, Started)
    await store.complete(USE.token, started.lease_id, {"shipped": 7})
    with commands_sent(redis_server) as seen:
        replay = await store.begin(USE, 30, 60)
    await client.aclose()
    assert replay == Finished(result={"shipped": 7})
    assert command_names(seen) == ["SET"]
