"""A Redis blip while a guard records its outcome: the work runs once, whatever the blip.

A fault proxy sits between Redis and the guard's client (the direct transport)
or the service (the HTTP transport, under gunicorn). The guarded body switches a
fault on just before it ends, so it bites exactly while ``complete`` or ``fail``
is sent, or while the body runs and its lease is renewed:

- a blip of about a second (``REFUSE``: open connections reset, new ones
  refused; ``BLACKHOLE``: nothing answers) changes nothing the caller sees:
  the normal result (or the body's own exception), the token SUCCEEDED, FAILED
  or released once, the body run once, a duplicate answered from the record;
- a fault longer than the lease ends in ``OutcomeNotRecorded`` (never
  ``ServiceUnavailable``, which means "did not run"), carrying what a person
  needs to reconcile; to the token it is a crashed holder: after its lease a
  duplicate runs the work again (docs/sdk.md says so beside "runs once").

Leases are 3 s, so the longer faults take a few seconds; every wait is for a
condition, no duration is asserted.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.processes import Gunicorn, RedisServer, wait_until
from tests.support.service import API_KEY, service_env
from tests.support.tcp_proxy import FaultProxy, Mode
from token_service.client import (
    AsyncTokenClient,
    OutcomeNotRecorded,
    ServiceUnavailable,
    TokenClient,
    TokenFailed,
    TokenInProgress,
    idempotent,
    keyed_guard,
)
from token_service.client._direct import DirectTransport
from token_service.client.advanced import operation_token
from token_service.tokens import record_key, token_digest

pytestmark = [pytest.mark.real, pytest.mark.slow]

SCOPE = "payment.create"
LEASE_SECONDS = 3
BLIP_SECONDS = 1.0
# a blackhole costs each attempt its socket timeout: long enough that the client's own four
# attempts (about 1.35 s with their back-off) end inside it, as the refused connections' 0.45 s do
BLACKHOLE_SECONDS = 1.5
SOCKET_TIMEOUT_SECONDS = 0.25


class Declined(Exception):
    """The guarded work's terminal failure."""


class Blip:
    """The proxy cut off from ``start()``: for ``seconds``, or until :meth:`heal` (None)."""

    def __init__(self, proxy: FaultProxy, mode: Mode, seconds: float | None) -> None:
        self.proxy = proxy
        self.mode = mode
        self.seconds = seconds
        self.healed = threading.Event()
        self._timer: threading.Timer | None = None

    def start(self) -> None:
        self.proxy.set_mode(self.mode)
        if self.mode is Mode.REFUSE:
            # The pooled connections too, so every call must reconnect. Resetting is done by each
            # connection's thread: wait for it (nothing new is accepted meanwhile), or the next
            # request could still go through on one of them.
            self.proxy.reset_all()
            wait_until(lambda: self.proxy.open_connections == 0, 30, 0.005, "the open connections reset")
        if self.seconds is not None:
            self._timer = threading.Timer(self.seconds, self.heal)
            self._timer.start()

    def heal(self) -> None:
        self.proxy.set_mode(Mode.PASS)
        self.healed.set()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.heal()


@pytest.fixture(scope="module")
def proxy(redis_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(("127.0.0.1", redis_server.port)) as fault_proxy:
        yield fault_proxy


@pytest.fixture(scope="module")
def service(proxy: FaultProxy) -> Iterator[Gunicorn]:
    env = service_env(f"redis://127.0.0.1:{proxy.port}/0", TOKEN_SERVICE_REDIS_TIMEOUT_SECONDS="0.5")
    server = Gunicorn(env, workers=1).start()
    yield server
    server.stop()


@pytest.fixture(params=["direct", "http"])
def client(request: pytest.FixtureRequest, proxy: FaultProxy) -> Iterator[TokenClient]:
    """The guard's client with the SDK's default retries, its Redis (or service) behind the proxy."""
    proxy.set_mode(Mode.PASS)
    if request.param == "direct":
        connection = redis.Redis(
            host="127.0.0.1",
            port=proxy.port,
            socket_timeout=SOCKET_TIMEOUT_SECONDS,
            socket_connect_timeout=SOCKET_TIMEOUT_SECONDS,
            retry=Retry(NoBackoff(), 0),  # the SDK's retries are what is tested, not redis-py's
        )
        with TokenClient.from_redis(connection) as direct:
            yield direct
        connection.close()
    else:
        service: Gunicorn = request.getfixturevalue("service")
        with TokenClient(service.url, api_key=API_KEY) as over_http:
            yield over_http
    proxy.set_mode(Mode.PASS)


@pytest.fixture
def other(real_redis: redis.Redis) -> Iterator[TokenClient]:
    """A duplicate's client, straight to Redis (no proxy)."""
    with TokenClient.from_redis(real_redis) as duplicate:
        yield duplicate


def state_of(real_redis: redis.Redis, token: str) -> bytes:
    value = real_redis.get(record_key("ts:", token))
    return b"" if value is None else value[:1]


def blip(proxy: FaultProxy, mode: Mode, seconds: float | None, request: pytest.FixtureRequest) -> Blip:
    fault = Blip(proxy, mode, seconds)
    request.addfinalizer(fault.close)
    return fault


def duplicate_runs(other: TokenClient, token: str, runs: list[float]) -> Any:
    """A duplicate, as a retrying caller sends it: answered from the record, or it runs."""

    def charge() -> dict[str, int]:
        runs.append(time.monotonic())
        return {"charged": 100}

    return other.guard(token, SCOPE, lease_seconds=LEASE_SECONDS).run(charge)


# -- a blip of about a second: nothing a caller can see ------------------------------------------


@pytest.mark.parametrize(
    ("mode", "seconds"), [(Mode.REFUSE, BLIP_SECONDS), (Mode.BLACKHOLE, BLACKHOLE_SECONDS)]
)
def test_a_blip_while_complete_is_sent_changes_nothing(
    client: TokenClient,
    other: TokenClient,
    proxy: FaultProxy,
    real_redis: redis.Redis,
    mode: Mode,
    seconds: float,
    request: pytest.FixtureRequest,
) -> None:
    if mode is Mode.BLACKHOLE and not isinstance(client._backend, DirectTransport):
        pytest.skip("behind the service a blackhole costs its Redis timeout per attempt; REFUSE shows it")
    token = client.generate(SCOPE).token
    fault = blip(proxy, mode, seconds, request)
    runs: list[float] = []

    def charge() -> dict[str, int]:
        runs.append(time.monotonic())
        fault.start()  # Redis goes away as the result is stored
        return {"charged": 100}

    assert client.guard(token, SCOPE, lease_seconds=LEASE_SECONDS).run(charge) == {"charged": 100}
    assert fault.healed.is_set()  # the result was stored after the blip, not before it
    assert state_of(real_redis, token) == b"S"
    assert duplicate_runs(other, token, runs) == {"charged": 100}
    assert len(runs) == 1


def test_a_blip_while_a_terminal_failure_is_recorded_changes_nothing(
    client: TokenClient,
    other: TokenClient,
    proxy: FaultProxy,
    real_redis: redis.Redis,
    request: pytest.FixtureRequest,
) -> None:
    token = client.generate(SCOPE).token
    fault = blip(proxy, Mode.REFUSE, BLIP_SECONDS, request)
    runs: list[float] = []

    def charge() -> None:
        runs.append(time.monotonic())
        fault.start()
        raise Declined("card declined")

    with pytest.raises(Declined):
        client.guard(token, SCOPE, lease_seconds=LEASE_SECONDS, terminal=(Declined,)).run(charge)
    assert fault.healed.is_set()
    assert state_of(real_redis, token) == b"F"
    with pytest.raises(TokenFailed) as failed:
        duplicate_runs(other, token, runs)
    assert failed.value.error == {"type": "Declined", "message": "card declined"}
    assert len(runs) == 1


def test_a_blip_while_a_release_is_sent_still_releases(
    client: TokenClient, proxy: FaultProxy, real_redis: redis.Redis, request: pytest.FixtureRequest
) -> None:
    token = client.generate(SCOPE).token
    fault = blip(proxy, Mode.REFUSE, BLIP_SECONDS, request)

    def charge() -> None:
        fault.start()
        raise RuntimeError("the provider timed out")  # retryable: the token is released

    with pytest.raises(RuntimeError):
        client.guard(token, SCOPE, lease_seconds=LEASE_SECONDS).run(charge)
    assert fault.healed.is_set()
    # released at once (ISSUED again), not left PROCESSING until the lease runs out
    assert state_of(real_redis, token) == b"I"


def test_a_blip_while_the_lease_is_renewed_keeps_the_lease(
    client: TokenClient,
    other: TokenClient,
    proxy: FaultProxy,
    real_redis: redis.Redis,
    request: pytest.FixtureRequest,
) -> None:
    token = client.generate(SCOPE).token
    fault = blip(proxy, Mode.REFUSE, BLIP_SECONDS, request)
    runs: list[float] = []
    refused: list[BaseException] = []

    def charge() -> dict[str, int]:
        runs.append(time.monotonic())
        fault.start()  # the next renewal falls inside it
        assert fault.healed.wait(30)
        # past the end of any lease taken before the blip: only a renewal after it keeps it
        time.sleep(LEASE_SECONDS + 0.5)
        try:
            duplicate_runs(other, token, runs)
        except TokenInProgress as busy:
            refused.append(busy)
        return {"charged": 100}

    assert client.guard(token, SCOPE, lease_seconds=LEASE_SECONDS).run(charge) == {"charged": 100}
    assert len(refused) == 1  # the lease was still held: the duplicate was refused, not run
    assert state_of(real_redis, token) == b"S"
    assert len(runs) == 1


# -- a fault longer than the lease: OutcomeNotRecorded, a crashed holder to the token ------------


def test_an_outage_longer_than_the_lease_at_complete_is_outcome_not_recorded(
    client: TokenClient,
    other: TokenClient,
    proxy: FaultProxy,
    real_redis: redis.Redis,
    request: pytest.FixtureRequest,
) -> None:
    token = client.generate(SCOPE).token
    fault = blip(proxy, Mode.REFUSE, None, request)
    runs: list[float] = []

    def charge() -> dict[str, int]:
        runs.append(time.monotonic())
        fault.start()
        return {"charged": 100}

    guard = client.guard(token, SCOPE, lease_seconds=LEASE_SECONDS)
    with pytest.raises(OutcomeNotRecorded) as caught:
        guard.run(charge)
    not_recorded = caught.value
    assert not isinstance(not_recorded, ServiceUnavailable)
    assert isinstance(not_recorded.__cause__, ServiceUnavailable)
    assert not_recorded.operation == "complete"
    assert not_recorded.result == {"charged": 100}
    assert not_recorded.token_ref == token_digest(token)
    assert not_recorded.token_ref in str(not_recorded)
    assert token not in str(not_recorded)  # the token is a secret: never in a message
    assert not_recorded.lease_id
    fault.heal()
    # To the token, a crashed holder: PROCESSING until the lease runs out, then a duplicate runs.
    assert state_of(real_redis, token) == b"P"
    wait_until(lambda: duplicate_runs_or_none(other, token, runs), 30, 0.2, "the lease to run out")
    assert len(runs) == 2


def duplicate_runs_or_none(other: TokenClient, token: str, runs: list[float]) -> bool:
    try:
        duplicate_runs(other, token, runs)
    except TokenInProgress:
        return False
    return True


def test_an_outage_longer_than_the_lease_at_fail_is_outcome_not_recorded(
    client: TokenClient, proxy: FaultProxy, real_redis: redis.Redis, request: pytest.FixtureRequest
) -> None:
    token = client.generate(SCOPE).token
    fault = blip(proxy, Mode.REFUSE, None, request)

    def charge() -> None:
        fault.start()
        raise Declined("card declined")

    with pytest.raises(OutcomeNotRecorded) as caught:
        client.guard(token, SCOPE, lease_seconds=LEASE_SECONDS, terminal=(Declined,)).run(charge)
    assert caught.value.operation == "fail"
    assert caught.value.error == {"type": "Declined", "message": "card declined"}
    assert isinstance(caught.value.__cause__, ServiceUnavailable)
    assert isinstance(caught.value.__context__, Declined | ServiceUnavailable)
    fault.heal()
    assert state_of(real_redis, token) == b"P"


def test_an_outage_longer_than_the_lease_while_it_is_renewed_is_outcome_not_recorded(
    client: TokenClient, proxy: FaultProxy, real_redis: redis.Redis, request: pytest.FixtureRequest
) -> None:
    token = client.generate(SCOPE).token
    fault = blip(proxy, Mode.REFUSE, None, request)
    runs: list[float] = []

    def charge() -> dict[str, int]:
        runs.append(time.monotonic())
        fault.start()
        time.sleep(LEASE_SECONDS + 0.5)  # no renewal gets through: the lease cannot be held
        return {"charged": 100}

    with pytest.raises(OutcomeNotRecorded) as caught:
        client.guard(token, SCOPE, lease_seconds=LEASE_SECONDS).run(charge)
    assert caught.value.operation == "complete"
    fault.heal()
    assert len(runs) == 1


# -- the asyncio guard: the same rule ----------------------------------------------------------


@pytest.mark.parametrize("seconds", [BLIP_SECONDS, None], ids=["blip", "longer-than-the-lease"])
def test_the_async_guard_rides_a_blip_at_complete_and_reports_a_longer_outage(
    other: TokenClient,
    proxy: FaultProxy,
    real_redis: redis.Redis,
    seconds: float | None,
    request: pytest.FixtureRequest,
) -> None:
    token = other.generate(SCOPE).token
    fault = blip(proxy, Mode.REFUSE, seconds, request)
    runs: list[float] = []

    async def charge() -> dict[str, int]:
        runs.append(time.monotonic())
        await asyncio.to_thread(fault.start)
        return {"charged": 100}

    async def run() -> Any:
        connection = redis.asyncio.Redis(
            host="127.0.0.1",
            port=proxy.port,
            socket_timeout=SOCKET_TIMEOUT_SECONDS,
            socket_connect_timeout=SOCKET_TIMEOUT_SECONDS,
            retry=AsyncRetry(NoBackoff(), 0),
        )
        try:
            client = AsyncTokenClient.from_redis(connection)
            return await client.guard(token, SCOPE, lease_seconds=LEASE_SECONDS).run(charge)
        finally:
            await connection.aclose()

    if seconds is not None:
        assert asyncio.run(run()) == {"charged": 100}
        assert state_of(real_redis, token) == b"S"
        assert duplicate_runs(other, token, runs) == {"charged": 100}
    else:
        with pytest.raises(OutcomeNotRecorded) as caught:
            asyncio.run(run())
        assert caught.value.result == {"charged": 100}
        assert isinstance(caught.value.__cause__, ServiceUnavailable)
    assert len(runs) == 1


# -- keyed operations (@idempotent, keyed_guard): the same guard, the key in the report ---------


@pytest.fixture
def direct(proxy: FaultProxy) -> Iterator[TokenClient]:
    """A direct client behind the proxy (keyed operations run on the direct transport only)."""
    proxy.set_mode(Mode.PASS)
    connection = redis.Redis(
        host="127.0.0.1",
        port=proxy.port,
        socket_timeout=SOCKET_TIMEOUT_SECONDS,
        socket_connect_timeout=SOCKET_TIMEOUT_SECONDS,
        retry=Retry(NoBackoff(), 0),
    )
    with TokenClient.from_redis(connection) as client:
        yield client
    connection.close()
    proxy.set_mode(Mode.PASS)


@pytest.mark.parametrize("seconds", [BLIP_SECONDS, None], ids=["blip", "longer-than-the-lease"])
def test_idempotent_rides_a_blip_at_complete_and_reports_a_longer_outage(
    direct: TokenClient,
    other: TokenClient,
    proxy: FaultProxy,
    seconds: float | None,
    request: pytest.FixtureRequest,
) -> None:
    fault = blip(proxy, Mode.REFUSE, seconds, request)
    order_id = f"o-{time.monotonic_ns()}"
    runs: list[str] = []

    def ship(order_id: str) -> dict[str, str]:
        runs.append(order_id)
        if len(runs) == 1:
            fault.start()
        return {"shipped": order_id}

    first = idempotent(direct, "order.ship", key="order_id", lease_seconds=LEASE_SECONDS)(ship)
    duplicate = idempotent(other, "order.ship", key="order_id", lease_seconds=LEASE_SECONDS)(ship)
    if seconds is not None:
        assert first(order_id) == {"shipped": order_id}
        assert duplicate(order_id) == {"shipped": order_id}  # the stored result: it does not run
        assert len(runs) == 1
        return
    with pytest.raises(OutcomeNotRecorded) as caught:
        first(order_id)
    assert caught.value.key == order_id
    assert repr(order_id) in str(caught.value)
    assert caught.value.token_ref == token_digest(operation_token("order.ship", order_id))
    assert caught.value.result == {"shipped": order_id}
    fault.heal()
    # a crashed holder's key: run again once its lease has run out (docs/integrations/functions.md)
    wait_until(lambda: ran_again(duplicate, order_id), 30, 0.2, "the lease to run out")
    assert len(runs) == 2


def ran_again(operation: Any, order_id: str) -> bool:
    try:
        operation(order_id)
    except TokenInProgress:
        return False
    return True


def test_keyed_guard_rides_a_blip_while_a_terminal_failure_is_recorded(
    direct: TokenClient, other: TokenClient, proxy: FaultProxy, request: pytest.FixtureRequest
) -> None:
    fault = blip(proxy, Mode.REFUSE, BLIP_SECONDS, request)
    invoice = f"i-{time.monotonic_ns()}"

    def send() -> None:
        with keyed_guard(direct, "invoice.send", invoice, lease_seconds=LEASE_SECONDS, terminal=(Declined,)):
            fault.start()
            raise Declined("mailbox full")

    with pytest.raises(Declined):
        send()
    assert fault.healed.is_set()
    with pytest.raises(TokenFailed), keyed_guard(other, "invoice.send", invoice):
        pytest.fail("a recorded terminal failure must not run again")
