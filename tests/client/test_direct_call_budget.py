"""On the direct transport ``timeout`` bounds the whole call, sync and async.

Against a Redis that hangs -- stopped with SIGSTOP (the kernel still accepts
connections, nothing answers), or behind a proxy that swallows everything
(BLACKHOLE) or refuses connections (REFUSE) -- a call ends soon after its
``timeout``, whatever redis-py's own retry, its reconnects and the SDK's
attempts would have added: with ``timeout=2`` one consume took 16.4 s before
(4 SDK attempts, each a read and redis-py's retry of it, each 2 s). A consume
cut short by its deadline may have run or not: its retry with the same
request id is a win either way (``replayed`` says which), never TokenUsed.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.support.processes import RedisServer
from tests.support.tcp_proxy import FaultProxy, Mode
from token_service.client import AsyncTokenClient, RetryPolicy, ServiceUnavailable, TokenClient, TokenUsed

pytestmark = pytest.mark.real
SCOPE = "payment.create"
TIMEOUT_SECONDS = 2.0
# Generous for a loaded machine; the old code took 16 s here, 8 s with one SDK attempt.
BOUND_SECONDS = 6.0
# Attempts whose waits alone (7.5 s or more) outlast the budget: against refused connections,
# which fail at once, the back-off is what has to stop at the deadline.
PATIENT = RetryPolicy(attempts=16, backoff_seconds=1.0, max_backoff_seconds=1.0)


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own: it is stopped with SIGSTOP."""
    server = RedisServer().start()
    yield server
    assert server.process is not None
    server.process.send_signal(signal.SIGCONT)  # never left stopped, whatever the test did
    server.stop()


@contextmanager
def stopped(server: RedisServer) -> Iterator[None]:
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        server.process.send_signal(signal.SIGCONT)


def test_a_consume_against_a_stopped_redis_ends_within_its_timeout(own_redis: RedisServer) -> None:
    with TokenClient.from_redis(own_redis.url, timeout=TIMEOUT_SECONDS) as client:
        token = client.generate(SCOPE).token
        started = time.monotonic()
        with pytest.raises(ServiceUnavailable), stopped(own_redis):
            client.consume(token, SCOPE, request_id="r-1")
        assert time.monotonic() - started < BOUND_SECONDS
        client.consume(token, SCOPE, request_id="r-1")  # the same request: a win, whichever
        with pytest.raises(TokenUsed):
            client.consume(token, SCOPE, request_id="r-2")


def test_an_async_consume_against_a_stopped_redis_ends_within_its_timeout(own_redis: RedisServer) -> None:
    async def scenario() -> None:
        async with AsyncTokenClient.from_redis(own_redis.url, timeout=TIMEOUT_SECONDS) as client:
            token = (await client.generate(SCOPE)).token
            started = time.monotonic()
            with pytest.raises(ServiceUnavailable), stopped(own_redis):
                await client.consume(token, SCOPE, request_id="r-1")
            assert time.monotonic() - started < BOUND_SECONDS
            await client.consume(token, SCOPE, request_id="r-1")
            with pytest.raises(TokenUsed):
                await client.consume(token, SCOPE, request_id="r-2")

    asyncio.run(scenario())


@pytest.fixture
def proxy(own_redis: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(("127.0.0.1", own_redis.port)) as proxy:
        yield proxy


def proxied_url(proxy: FaultProxy) -> str:
    return f"redis://127.0.0.1:{proxy.port}/0"


def fail(proxy: FaultProxy, mode: Mode) -> None:
    proxy.set_mode(mode)
    proxy.reset_all()  # REFUSE leaves open connections working: the client must connect anew


@pytest.mark.parametrize("mode", [Mode.BLACKHOLE, Mode.REFUSE])
def test_a_consume_behind_a_dead_proxy_ends_within_its_timeout(proxy: FaultProxy, mode: Mode) -> None:
    with TokenClient.from_redis(proxied_url(proxy), timeout=TIMEOUT_SECONDS, retry=PATIENT) as client:
        token = client.generate(SCOPE).token
        fail(proxy, mode)
        started = time.monotonic()
        with pytest.raises(ServiceUnavailable):
            client.consume(token, SCOPE, request_id="r-1")
        assert time.monotonic() - started < BOUND_SECONDS
        proxy.set_mode(Mode.PASS)
        assert client.consume(token, SCOPE, request_id="r-1").replayed is False


@pytest.mark.parametrize("mode", [Mode.BLACKHOLE, Mode.REFUSE])
def test_an_async_consume_behind_a_dead_proxy_ends_within_its_timeout(proxy: FaultProxy, mode: Mode) -> None:
    async def scenario() -> None:
        url = proxied_url(proxy)
        async with AsyncTokenClient.from_redis(url, timeout=TIMEOUT_SECONDS, retry=PATIENT) as client:
            token = (await client.generate(SCOPE)).token
            fail(proxy, mode)
            started = time.monotonic()
            with pytest.raises(ServiceUnavailable):
                await client.consume(token, SCOPE, request_id="r-1")
            assert time.monotonic() - started < BOUND_SECONDS
            proxy.set_mode(Mode.PASS)
            assert (await client.consume(token, SCOPE, request_id="r-1")).replayed is False

    asyncio.run(scenario())


def test_a_new_connection_to_a_stopped_redis_keeps_to_the_timeout(own_redis: RedisServer) -> None:
    """No connection open yet: the connect and its handshake spend the same budget."""
    with TokenClient.from_redis(own_redis.url, timeout=TIMEOUT_SECONDS) as client, stopped(own_redis):
        started = time.monotonic()
        with pytest.raises(ServiceUnavailable):
            client.generate(SCOPE)
        assert time.monotonic() - started < BOUND_SECONDS
