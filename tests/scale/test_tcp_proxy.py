"""Self-test of the fault-injection proxy against a real redis-server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.processes import RedisServer, wait_until
from tests.support.tcp_proxy import FaultProxy, Mode

pytestmark = pytest.mark.real


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(("127.0.0.1", redis_server.port)) as running:
        yield running


def no_retry_client(proxy: FaultProxy, timeout_seconds: float = 5.0) -> redis.Redis:
    # redis-py retries by default; the self-test wants to see each fault raw. 5 s by default: a reply
    # that is not held back must come within it through the proxy on a loaded machine.
    return redis.Redis(
        port=proxy.port,
        socket_timeout=timeout_seconds,
        socket_connect_timeout=timeout_seconds,
        retry=Retry(NoBackoff(), 0),
    )


def test_passes_traffic_both_ways(proxy: FaultProxy, real_redis: redis.Redis) -> None:
    client = no_retry_client(proxy)
    client.set("proxy:k", "v" * 200_000)  # larger than one chunk
    assert client.get("proxy:k") == b"v" * 200_000
    assert real_redis.get("proxy:k") == b"v" * 200_000
    assert proxy.stats.accepted == 1


def test_reset_all_breaks_a_command_in_flight_then_heals(proxy: FaultProxy, real_redis: redis.Redis) -> None:
    client = no_retry_client(proxy, timeout_seconds=60)
    assert client.ping()
    outcome: list[BaseException | object] = []

    def blocked() -> None:
        try:
            # 30 s: however long the BLPOP took to block on a loaded machine, its own timeout is far off
            outcome.append(client.blpop(["proxy:never"], timeout=30))
        except redis.ConnectionError as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=blocked)
    waiter.start()
    wait_until(lambda: real_redis.info("clients")["blocked_clients"] == 1, what="BLPOP blocked")
    reset_at = time.monotonic()
    assert proxy.reset_all() == 1
    waiter.join(timeout=30)
    assert isinstance(outcome[0], redis.ConnectionError)  # a BLPOP timeout would have answered None
    assert time.monotonic() - reset_at < 10  # the reset, not the 30 s BLPOP timeout, ended it
    assert client.ping()  # a fresh connection passes again


def test_reset_mode_resets_new_connections(proxy: FaultProxy) -> None:
    client = no_retry_client(proxy)
    with proxy.fault(Mode.RESET), pytest.raises(redis.ConnectionError):
        client.ping()
    assert client.ping()


def test_dropped_reply_means_the_server_did_the_work(proxy: FaultProxy, real_redis: redis.Redis) -> None:
    client = no_retry_client(proxy)
    assert client.ping()  # connection set up outside the fault
    proxy.drop_replies(1, match=b"INCR")
    with pytest.raises(redis.ConnectionError):
        client.incr("proxy:counter")
    assert proxy.stats.replies_dropped == 1
    assert real_redis.get("proxy:counter") == b"1"  # Redis ran it; the client never heard
    assert client.incr("proxy:counter") == 2  # only the next one was dropped


def test_dropped_reply_can_hang_until_the_client_times_out(
    proxy: FaultProxy, real_redis: redis.Redis
) -> None:
    # 1 s: the first ping's reply must come within it, through the proxy, on a loaded machine
    client = no_retry_client(proxy, timeout_seconds=1)
    assert client.ping()
    proxy.drop_replies(1, then="hang")
    with pytest.raises(redis.TimeoutError):
        client.set("proxy:hung", "1")
    # forwarded (the proxy may forward it after the client gave up, when this process is slow)
    wait_until(lambda: real_redis.get("proxy:hung") == b"1", what="the SET to reach Redis")


def test_blackhole_accepts_but_never_answers(proxy: FaultProxy) -> None:
    client = no_retry_client(proxy, timeout_seconds=0.3)
    with proxy.fault(Mode.BLACKHOLE):
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            client.ping()
        assert time.monotonic() - started >= 0.25
    assert no_retry_client(proxy).ping()  # a new connection outside the fault passes


def test_refuse_closes_the_port_and_reopens_it(proxy: FaultProxy) -> None:
    port = proxy.port
    with proxy.fault(Mode.REFUSE):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=1)
        with pytest.raises(redis.ConnectionError):
            no_retry_client(proxy).ping()
    assert proxy.port == port
    assert no_retry_client(proxy).ping()


def test_upstream_down_resets_the_client() -> None:
    with FaultProxy(("127.0.0.1", 1)) as proxy:  # nothing listens on port 1
        with pytest.raises(redis.ConnectionError):
            no_retry_client(proxy).ping()
        assert proxy.stats.refused_upstream == 1
