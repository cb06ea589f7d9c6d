"""A lost reply never turns a win into TokenUsed.

A fault-injection proxy sits between the client and Redis (direct transport)
or gunicorn (HTTP transport). It forwards the consume, lets the server run
it, and swallows the reply. The client retries with the same request id and
reports the win (``replayed=True``); any other caller gets TokenUsed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.processes import Gunicorn, RedisServer
from tests.support.service import API_KEY
from tests.support.tcp_proxy import FaultProxy
from token_service.client import AsyncTokenClient, RetryPolicy, ServiceUnavailable, TokenClient, TokenUsed
from token_service.client.advanced import Consumed, Started
from token_service.scripts import lua_source
from token_service.tokens import record_key

pytestmark = pytest.mark.real
SCOPE = "payment.create"
RETRY = RetryPolicy(attempts=3, backoff_seconds=0.01, max_backoff_seconds=0.05)
# How long a call waits for its reply: a swallowed reply ("hang") costs this much, and a reply that
# was not swallowed must always come sooner, through the proxy, on a loaded CI machine (0.5 s for
# Redis and 1 s for HTTP did not leave that much room).
REDIS_TIMEOUT_SECONDS = 2.0
HTTP_TIMEOUT_SECONDS = 3.0


@pytest.fixture
def redis_proxy(redis_server: RedisServer, real_redis: redis.Redis) -> Iterator[FaultProxy]:
    with FaultProxy(("127.0.0.1", redis_server.port)) as proxy:
        yield proxy


def without_inner_retry(proxy: FaultProxy) -> redis.Redis:
    """A client whose redis-py layer does not retry: the SDK's RetryPolicy is what is tested."""
    return redis.Redis(
        host="127.0.0.1", port=proxy.port, socket_timeout=REDIS_TIMEOUT_SECONDS, retry=Retry(NoBackoff(), 0)
    )


def script_sha(name: str, client: redis.Redis) -> bytes:
    script = client.register_script(lua_source(name))
    client.script_load(script.script)  # loaded up front: the dropped call is the real one, not a NOSCRIPT
    return script.sha.encode()


@pytest.mark.parametrize("then", ["reset", "hang"])
def test_direct_consume_whose_reply_is_lost_is_reported_as_the_win(
    redis_proxy: FaultProxy, real_redis: redis.Redis, then: Literal["reset", "hang"]
) -> None:
    client = TokenClient.from_redis(without_inner_retry(redis_proxy), retry=RETRY)
    other = TokenClient.from_redis(real_redis)
    with client:
        token = client.generate(SCOPE).token
        redis_proxy.drop_replies(1, match=script_sha("consume", real_redis), then=then)
        assert client.consume(token, SCOPE) == Consumed(replayed=True)
        assert redis_proxy.stats.replies_dropped == 1
        with pytest.raises(TokenUsed):
            other.consume(token, SCOPE)
    assert real_redis.get(record_key("ts:", token)).startswith(b"C")


def test_without_retries_the_lost_reply_is_unavailable_not_used(
    redis_proxy: FaultProxy, real_redis: redis.Redis
) -> None:
    # the control: the fault is real, and even then the caller never hears TokenUsed
    client = TokenClient.from_redis(without_inner_retry(redis_proxy), retry=1)
    with client:
        token = client.generate(SCOPE).token
        redis_proxy.drop_replies(1, match=script_sha("consume", real_redis))
        with pytest.raises(ServiceUnavailable):
            client.consume(token, SCOPE, request_id="mine")
        # the caller's own later retry, with its request id, still learns it won
        assert client.consume(token, SCOPE, request_id="mine") == Consumed(replayed=True)


def test_direct_begin_whose_reply_is_lost_gets_its_lease_back(
    redis_proxy: FaultProxy, real_redis: redis.Redis
) -> None:
    client = TokenClient.from_redis(without_inner_retry(redis_proxy), retry=RETRY)
    with client:
        token = client.generate(SCOPE).token
        redis_proxy.drop_replies(1, match=script_sha("begin", real_redis))
        result = client.guard(token, SCOPE).run(lambda: {"charged": 1})
        assert result == {"charged": 1}
        assert redis_proxy.stats.replies_dropped == 1
    assert TokenClient.from_redis(real_redis).verify(token).result == {"charged": 1}


async def test_async_direct_consume_whose_reply_is_lost(
    redis_proxy: FaultProxy, real_redis: redis.Redis
) -> None:
    async_redis = redis.asyncio.Redis(
        host="127.0.0.1",
        port=redis_proxy.port,
        socket_timeout=REDIS_TIMEOUT_SECONDS,
        retry=AsyncRetry(NoBackoff(), 0),
    )
    client = AsyncTokenClient.from_redis(async_redis, retry=RETRY)
    async with client:
        token = (await client.generate(SCOPE)).token
        redis_proxy.drop_replies(1, match=script_sha("consume", real_redis))
        assert await client.consume(token, SCOPE) == Consumed(replayed=True)
        assert redis_proxy.stats.replies_dropped == 1
        with pytest.raises(TokenUsed):
            await client.consume(token, SCOPE)
    await async_redis.aclose()


@pytest.fixture
def http_proxy(gunicorn: Gunicorn, real_redis: redis.Redis) -> Iterator[FaultProxy]:
    with FaultProxy(("127.0.0.1", gunicorn.port)) as proxy:
        yield proxy


def test_http_consume_whose_reply_is_lost_is_reported_as_the_win(
    http_proxy: FaultProxy, gunicorn: Gunicorn
) -> None:
    client = TokenClient(
        f"http://127.0.0.1:{http_proxy.port}", API_KEY, timeout=HTTP_TIMEOUT_SECONDS, retry=RETRY
    )
    other = TokenClient(gunicorn.url, API_KEY)
    with client, other:
        token = client.generate(SCOPE).token
        http_proxy.drop_replies(1, match=b"POST /token/consume", then="reset")
        assert client.consume(token, SCOPE) == Consumed(replayed=True)
        assert http_proxy.stats.replies_dropped == 1
        with pytest.raises(TokenUsed):
            other.consume(token, SCOPE)


def test_http_consume_whose_reply_never_comes_is_unavailable_then_found_by_its_request_id(
    http_proxy: FaultProxy, gunicorn: Gunicorn
) -> None:
    """A reply that never comes spends the call's whole timeout (its budget, every attempt
    included): the call is unavailable, never TokenUsed, and the caller's own retry with the
    same request id learns that it won."""
    client = TokenClient(
        f"http://127.0.0.1:{http_proxy.port}", API_KEY, timeout=HTTP_TIMEOUT_SECONDS, retry=RETRY
    )
    with client:
        token = client.generate(SCOPE).token
        http_proxy.drop_replies(1, match=b"POST /token/consume", then="hang")
        with pytest.raises(ServiceUnavailable, match="within the call's timeout"):
            client.consume(token, SCOPE, request_id="mine")
        assert http_proxy.stats.replies_dropped == 1
        assert client.consume(token, SCOPE, request_id="mine") == Consumed(replayed=True)


def test_http_begin_whose_reply_is_lost_keeps_one_lease(http_proxy: FaultProxy, gunicorn: Gunicorn) -> None:
    client = TokenClient(
        f"http://127.0.0.1:{http_proxy.port}", API_KEY, timeout=HTTP_TIMEOUT_SECONDS, retry=RETRY
    )
    with client:
        token = client.generate(SCOPE).token
        http_proxy.drop_replies(1, match=b"POST /token/begin")
        started = client.begin(token, SCOPE)
        assert isinstance(started, Started)
        assert started.replayed  # the retry got the lease the lost reply carried
        assert client.complete(token, started.lease_id, "ok").replayed is False


async def test_async_client_from_a_url_survives_a_lost_reply(
    redis_proxy: FaultProxy, real_redis: redis.Redis
) -> None:
    client = AsyncTokenClient.from_redis(
        f"redis://127.0.0.1:{redis_proxy.port}/0", timeout=REDIS_TIMEOUT_SECONDS, retry=RETRY
    )
    async with client:
        token = (await client.generate(SCOPE)).token
        redis_proxy.drop_replies(1, match=script_sha("consume", real_redis))
        assert await client.consume(token, SCOPE) == Consumed(replayed=True)
        assert redis_proxy.stats.replies_dropped == 1
