"""A client whose wall clock is wrong still runs each operation once.

Each test runs the client in a child process under ``faketime`` (its
``time.time()`` 20 s behind and 20 s ahead — more than a lease — while its
monotonic clock stays true, :mod:`tests.support.skew`), against a real
redis-server and, over HTTP, ``token-service serve``. Issue 24's reproduction,
with room for a loaded machine: the service's default lease is 5 s (the issue
used 3 s; a renewal every third of it then has 3 s to land, not 2), a duplicate
arrives 6 s into the operation — after the lease would have run out unrenewed —
and the operation goes on until then (it ends when the test says, so a slow
machine cannot end it before the duplicate comes). The duplicate must get
``TokenInProgress``, and the operation must run exactly once.

Before the fix the guard renewed at a third of ``lease_expires - time.time()``
(Redis's clock against the client's): 20 s behind it renewed after 8.3 s, 20 s
ahead it fell back to every 10 s; both let the duplicate run it again.
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
from token_service.client import TokenClient, keyed_guard
from token_service.client._renewal import interval_for
from token_service.client.advanced import DirectLimits
from token_service.errors import TokenInProgress
from token_service.records import UseRequest

LEASE_SECONDS = 5
DUPLICATE_AFTER_SECONDS = 6  # past the lease: only renewal keeps the duplicate out
SHIFTS_SECONDS = (-20, +20)

# slow: every test starts client processes under faketime and waits out leases (~140 s)
pytestmark = [pytest.mark.real, pytest.mark.slow]


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


# -- the other places a client waits on, or shows, a time from the store ------------------------


def test_a_waiting_duplicate_gets_the_result_whatever_its_clock(
    skew_redis: RedisServer, skew_service: str
) -> None:
    """``wait_seconds`` polls on the monotonic clock with the service's Retry-After (seconds):
    a duplicate whose clock is off waits for the holder and gets its result without running."""
    counters = skew_redis.client()
    with TokenClient(skew_service, api_key=API_KEY) as holder_client, closing(counters):
        for shift in SHIFTS_SECONDS:
            token = holder_client.generate("payment.create").token
            holder = holder_client.guard(token, "payment.create")
            assert holder.start()
            args = {
                "transport": "http",
                "base_url": skew_service,
                "api_key": API_KEY,
                "redis_url": skew_redis.url,
                "token": token,
                "scope": "payment.create",
                "wait_seconds": 60,
                "counter_key": f"runs:{secrets.token_hex(8)}",
            }
            with Skewed(shift, "wait", args) as child:
                child.check_shifted()
                time.sleep(1)  # the duplicate is (usually) polling by now; either way it must wait
                holder.succeed("held")
                assert child.finish() == {"result": "held"}
            assert counters.get(args["counter_key"]) is None  # the duplicate never ran the work

            # a duplicate that does not wait is told how long, in seconds of the lease's length
            token = holder_client.generate("payment.create").token
            busy = holder_client.guard(token, "payment.create")
            assert busy.start()
            with Skewed(shift, "wait", {**args, "token": token, "wait_seconds": 0}) as child:
                child.check_shifted()
                refused = child.finish()
            busy.abandon()
            assert refused["in_progress"] is True
            assert 1 <= refused["retry_after_seconds"] <= LEASE_SECONDS


@pytest.mark.parametrize("scenario", ["middleware", "asgi_middleware"])
def test_the_idempotency_key_lock_is_renewed_whatever_the_clock(
    skew_redis: RedisServer, scenario: str
) -> None:
    """The WSGI and ASGI middlewares' lock (5 s) held by a request in a shifted process: a repeat
    6 s in gets 409, and the request runs once. (Django's middleware shares their core.)"""
    from werkzeug.test import Client

    from token_service.client.wsgi import IdempotencyMiddleware

    counters = skew_redis.client()
    with closing(counters):
        for shift in SHIFTS_SECONDS:
            args = {
                "redis_url": skew_redis.url,
                "lock_seconds": LEASE_SECONDS,
                "key": f'"order-{secrets.token_hex(8)}"',
                "counter_key": f"runs:{secrets.token_hex(8)}",
            }

            def repeat_app(environ: Any, start_response: Any, key: str = args["counter_key"]) -> list[bytes]:
                counters.incr(key)
                start_response("201 Created", [("Content-Type", "text/plain")])
                return [b"created again"]

            repeat = IdempotencyMiddleware(
                repeat_app, counters, lock_seconds=LEASE_SECONDS, identity=lambda environ: "client-1"
            )
            with Skewed(shift, scenario, args) as child:
                child.check_shifted()
                assert child.read() == {"started": True}
                time.sleep(DUPLICATE_AFTER_SECONDS)
                again = Client(repeat).post("/orders", data=b"{}", headers={"Idempotency-Key": args["key"]})
                assert again.status_code == 409, f"wall clock {shift:+d} s: {again.get_data(as_text=True)}"
                assert 1 <= int(again.headers["Retry-After"]) <= LEASE_SECONDS
                child.send(finish=True)
                assert child.finish() == {"status": 201, "body": "created"}
            assert int(counters.get(args["counter_key"]) or 0) == 1


def test_the_admin_view_of_a_lease_is_redis_time_whatever_the_clock(skew_redis: RedisServer) -> None:
    """ops/admin's "lease expired" and "time left" come from Redis's TIME with the record, so an
    operator's machine with a wrong clock shows a live lease as live and a dead one as dead."""
    from tests.ops.clock import past_clock
    from token_service.store import TokenStore
    from token_service.tokens import token_digest

    live_lease_seconds = 60  # it must outlive the child's start on a loaded machine
    client = skew_redis.client()
    with closing(client):
        # a lease that ran out 5 s ago: a view 20 s behind would still call it live
        store, past = TokenStore(client), TokenStore(client, clock_ms=past_clock(LEASE_SECONDS + 5))
        live, dead = store.issue(_request(), 2)
        past.begin(UseRequest(dead, "payment.create", None, None, "dead"), lease_seconds=LEASE_SECONDS)
        refs = {"live": token_digest(live), "dead": token_digest(dead)}
        began = time.monotonic()
        store.begin(UseRequest(live, "payment.create", None, None, "live"), lease_seconds=live_lease_seconds)
        for shift in SHIFTS_SECONDS:
            with Skewed(shift, "admin", {"redis_url": skew_redis.url, "refs": refs}) as child:
                child.check_shifted()
                seen = child.finish()
            elapsed = time.monotonic() - began
            assert seen["shown"]["live"]["lease_expired"] is False
            # what is left, as Redis counts it: between the full lease and what our clock saw pass
            left = seen["shown"]["live"]["lease_expires_in_seconds"]
            assert live_lease_seconds - elapsed - 0.01 <= left <= live_lease_seconds
            assert seen["shown"]["dead"]["lease_expired"] is True
            assert seen["stuck"] == [refs["dead"]]


def _request() -> Any:
    from token_service.records import IssueRequest

    return IssueRequest("payment.create", None, None, 600)


# -- the lease's length, as the replies carry it -----------------------------------------------


def _begin_reply(**extra: Any) -> Any:
    import httpx

    body = {
        "outcome": "started",
        "lease_id": "lease-1",
        # an expiry far from this host's clock: the guard must not read it
        "lease_expires_at": "2001-01-01T00:00:00Z",
        "replayed": False,
        **extra,
    }
    return httpx.MockTransport(lambda request: httpx.Response(200, json=body))


@pytest.mark.parametrize(
    ("reply", "asked_seconds", "lease_seconds", "counted"),
    [
        ({"lease_seconds": 30}, None, 30.0, True),  # the service's default, said by the reply
        ({"lease_seconds": 2.4}, 30, 2.4, True),  # what is left of a retried begin's lease wins
        # a service too old to say: what the guard asked for, counted from the send all the same
        # (how long an outcome may be retried is what is left of it)
        ({}, 12, 12.0, True),
        ({}, None, 1.0, True),  # ... or, asked for nothing, the shortest lease the API grants
    ],
)
def test_the_guard_renews_by_the_replys_lease_length(
    reply: dict[str, Any], asked_seconds: int | None, lease_seconds: float, counted: bool
) -> None:
    client = TokenClient("http://tokens.test", api_key=API_KEY, transport=_begin_reply(**reply))
    with closing(client):
        guard = client.guard("t" * 22, "payment.create", lease_seconds=asked_seconds, renew=False)
        before = time.monotonic()
        assert guard.start()
        every = guard._renew_every()
        passed = time.monotonic() - before
    # a third of the lease, counted from begin's send (so less by however long has passed since)
    low = interval_for(lease_seconds - passed) if counted else interval_for(lease_seconds)
    assert low <= every <= interval_for(lease_seconds)


def test_begin_and_renew_say_how_long_the_lease_runs(client: Any) -> None:
    """The service's replies carry the lease as a duration (``lease_seconds``), beside its end on
    Redis's clock: what the SDK counts on its monotonic clock (fake and real Redis)."""
    auth = {"Authorization": f"Bearer {API_KEY}"}
    token = client.post("/token/generate", json={"scope": "payment.create"}, headers=auth).json["token"]
    begin = {"token": token, "scope": "payment.create", "request_id": "r-1", "lease_seconds": 7}
    started = client.post("/token/begin", json=begin, headers=auth).json
    assert started["lease_seconds"] == 7
    again = client.post("/token/begin", json=begin, headers=auth).json  # a retried begin: what is left
    assert again["replayed"] is True
    assert 0 < again["lease_seconds"] <= 7
    renew = {"token": token, "lease_id": started["lease_id"], "lease_seconds": 9}
    assert client.post("/token/renew", json=renew, headers=auth).json["lease_seconds"] == 9
