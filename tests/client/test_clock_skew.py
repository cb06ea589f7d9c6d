"""A client whose wall clock is wrong still runs each operation once.

Each test runs the client in a child process under ``faketime`` (its
``time.time()`` 10 s behind and 10 s ahead — more than a lease — while its
monotonic clock stays true, :mod:`tests.support.skew`), against a real
redis-server and, over HTTP, ``token-service serve``. The reproduction of
issue 24: the service's default lease is 3 s, a duplicate arrives 4 s into the
operation — after the lease would have run out unrenewed — and the operation
goes on until then (it ends when the test says, so a slow machine cannot end
it before the duplicate comes). The duplicate must get ``TokenInProgress``,
and the operation must run exactly once.

Before the fix the guard renewed at a third of ``lease_expires - time.time()``
(Redis's clock against the client's): 10 s behind it renewed after 4.3 s,
10 s ahead it fell back to every 10 s; both let the duplicate run it again.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import RedisServer, serve_one_worker
from tests.support.service import API_KEY, service_env
from tests.support.skew import Skewed
from token_service.client import DirectLimits, TokenClient, keyed_guard
from token_service.errors import TokenInProgress

LEASE_SECONDS = 3
DUPLICATE_AFTER_SECONDS = 4  # past the lease: only renewal keeps the duplicate out
SHIFTS_SECONDS = (-10, +10)

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def skew_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def skew_service(skew_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = service_env(skew_redis.url, TOKEN_SERVICE_DEFAULT_LEASE_SECONDS=str(LEASE_SECONDS))
    log = tmp_path_factory.mktemp("skew") / "serve.log"
    with serve_one_worker(env, Path(log)) as (host, port):
        yield f"http://{host}:{port}"


def _client(transport: str, redis_url: str, base_url: str | None) -> TokenClient:
    if transport == "http":
        assert base_url is not None
        return TokenClient(base_url, api_key=API_KEY)
    return TokenClient.from_redis(redis_url, limits=DirectLimits(default_lease_seconds=LEASE_SECONDS))


def _run_once_under_skew(transport: str, mode: str, redis_server: RedisServer, base_url: str | None) -> None:
    """Each shift in turn (a child and a token each); every operation runs once."""
    failures: list[str] = []
    for shift in SHIFTS_SECONDS:
        try:
            _one_run(shift, transport, mode, redis_server, base_url)
        except (Exception, pytest.fail.Exception) as exc:  # report every shift, not only the first
            notes = "".join(f"\n{note}" for note in getattr(exc, "__notes__", ()))
            failures.append(f"the client's wall clock {shift:+d} s: {type(exc).__name__}: {exc}{notes}")
    if failures:
        pytest.fail("\n".join(failures))


def _one_run(shift: int, transport: str, mode: str, redis_server: RedisServer, base_url: str | None) -> None:
    counters = redis_server.client()
    parent = _client(transport, redis_server.url, base_url)
    args: dict[str, Any] = {
        "transport": transport,
        "mode": mode,
        "redis_url": redis_server.url,
        "base_url": base_url,
        "api_key": API_KEY,
        "default_lease_seconds": LEASE_SECONDS,
        "scope": "payment.create",
        "counter_key": f"runs:{secrets.token_hex(8)}",
        "key": f"order-{secrets.token_hex(8)}",
    }
    if mode in ("sync", "async"):
        args["token"] = parent.generate("payment.create").token

    def duplicate_work() -> str:
        counters.incr(args["counter_key"])
        return "duplicate"

    with Skewed(shift, "guard", args) as child, closing(parent), closing(counters):
        child.check_shifted()
        assert child.read() == {"started": True}
        # the child's work goes on until told: the duplicate always finds it running
        time.sleep(DUPLICATE_AFTER_SECONDS)
        if mode in ("sync", "async"):
            duplicate = parent.guard(args["token"], args["scope"])
        else:  # keyed operations run on the direct transport
            duplicate = keyed_guard(parent, args["scope"], args["key"])
        with pytest.raises(TokenInProgress):
            duplicate.run(duplicate_work)
        child.send(finish=True)
        assert child.finish() == {"result": "done"}
        assert int(counters.get(args["counter_key"]) or 0) == 1


def test_guard_over_http_renews_on_time_whatever_the_clock(
    skew_redis: RedisServer, skew_service: str
) -> None:
    _run_once_under_skew("http", "sync", skew_redis, skew_service)


def test_async_guard_over_http_renews_on_time_whatever_the_clock(
    skew_redis: RedisServer, skew_service: str
) -> None:
    _run_once_under_skew("http", "async", skew_redis, skew_service)


def test_guard_on_direct_transport_renews_on_time_whatever_the_clock(skew_redis: RedisServer) -> None:
    _run_once_under_skew("direct", "sync", skew_redis, None)


@pytest.mark.parametrize("mode", ["keyed", "idempotent"])
def test_keyed_operations_renew_on_time_whatever_the_clock(skew_redis: RedisServer, mode: str) -> None:
    _run_once_under_skew("direct", mode, skew_redis, None)
