"""Any function keyed by any value (``idempotent``, ``keyed_guard``), on fakeredis and a real redis-server."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import fakeredis
import httpx
import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.processes import RedisServer
from tests.support.sdk import inproc_app
from tests.support.service import AUTH, FAST_RETRY
from token_service.client import (
    AsyncTokenClient,
    LeaseLost,
    Replayed,
    ServiceUnavailable,
    TokenClient,
    TokenFailed,
    TokenInProgress,
    TokenInvalid,
    TokenMismatch,
    idempotent,
    keyed_guard,
)
from token_service.client.advanced import Started, operation_token
from token_service.records import UseRequest
from token_service.store import TokenStore

BACKENDS = [pytest.param("fake", marks=pytest.mark.fake), pytest.param("real", marks=pytest.mark.real)]


class Calls:
    """Counts the runs of a body, thread-safely."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def hit(self) -> int:
        with self._lock:
            self.count += 1
            return self.count


@pytest.fixture(params=BACKENDS)
def raw(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "fake":
        client: Any = fakeredis.FakeRedis(server=fakeredis.FakeServer())
        yield client
        client.close()
    else:
        yield request.getfixturevalue("real_redis")


@pytest.fixture
def client(raw: Any) -> Iterator[TokenClient]:
    with TokenClient.from_redis(raw, retry=FAST_RETRY) as sdk:
        yield sdk


@pytest.fixture(params=BACKENDS)
async def async_client(request: pytest.FixtureRequest) -> AsyncIterator[AsyncTokenClient]:
    if request.param == "fake":
        raw: Any = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        request.getfixturevalue("real_redis")  # flushed around the test
        raw = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
    async with AsyncTokenClient.from_redis(raw, retry=FAST_RETRY) as sdk:
        yield sdk
    await raw.aclose()


def test_runs_once_per_key_and_replays_the_json_result(client: TokenClient) -> None:
    calls = Calls()

    @idempotent(client, "order.ship", key="order_id")
    def ship(order_id: str, address: str) -> Any:
        calls.hit()
        return {"order": order_id, "parcels": (1, 2)}

    first = ship("o-1", "Main St")
    assert first == {"order": "o-1", "parcels": [1, 2]}  # the JSON form, what duplicates get
    assert ship("o-1", "Main St") == first
    assert ship(order_id="o-1", address="Main St") == first  # keyword or positional: the same key
    assert calls.count == 1
    assert ship("o-2", "Main St")["order"] == "o-2"
    assert calls.count == 2
    assert ship.__name__ == "ship"


def test_key_made_of_several_arguments_or_a_callable(client: TokenClient) -> None:
    calls = Calls()

    @idempotent(client, "cart.checkout", key=("user", "cart"))
    def checkout(user: str, cart: int, note: str = "") -> int:
        return calls.hit()

    assert checkout("alice", 1) == checkout("alice", 1, note="again") == 1
    assert checkout("alice", 2) == 2
    assert checkout("bob", 1) == 3

    @idempotent(client, "message.handle", key=lambda message: message["id"])
    def handle(message: dict[str, Any]) -> int:
        return calls.hit()

    assert handle({"id": 7, "body": "x"}) == handle({"id": 7, "body": "x"}) == 4


def test_the_same_key_in_another_scope_is_another_operation(client: TokenClient) -> None:
    assert operation_token("a.b", "k") != operation_token("a.c", "k")
    assert operation_token("a.b", ("u", 1)) == operation_token("a.b", ["u", 1])
    # str "1" and int 1 are different keys (JSON keeps them apart)
    assert operation_token("a.b", "1") != operation_token("a.b", 1)


def test_an_exception_releases_the_key_for_a_retry(client: TokenClient) -> None:
    calls = Calls()

    @idempotent(client, "invoice.send", key="invoice_id")
    def send(invoice_id: str) -> str:
        if calls.hit() == 1:
            raise ConnectionError("smtp down")
        return "sent"

    with pytest.raises(ConnectionError):
        send("i-1")
    assert send("i-1") == "sent"
    assert send("i-1") == "sent"
    assert calls.count == 2


class Declined(Exception):
    pass


def test_a_terminal_failure_is_recorded_for_every_duplicate(client: TokenClient) -> None:
    calls = Calls()

    @idempotent(client, "payment.charge", key="payment_id", terminal=(Declined,))
    def charge(payment_id: str) -> str:
        calls.hit()
        raise Declined("card declined")

    with pytest.raises(Declined):
        charge("p-1")
    for _ in range(2):
        with pytest.raises(TokenFailed) as failed:
            charge("p-1")
        assert failed.value.error == {"type": "Declined", "message": "card declined"}
    assert calls.count == 1


def test_a_result_that_is_not_json_never_lets_the_function_run_again(client: TokenClient) -> None:
    calls = Calls()

    @idempotent(client, "odd.result", key="n")
    def odd(n: int) -> object:
        calls.hit()
        return object()

    with pytest.raises(TypeError):
        odd(1)
    with pytest.raises(TokenFailed):
        odd(1)
    assert calls.count == 1


def test_the_same_key_with_another_fingerprint_is_refused(client: TokenClient) -> None:
    @idempotent(client, "transfer.make", key="transfer_id", fingerprint=("amount", "to"))
    def transfer(transfer_id: str, amount: int, to: str) -> int:
        return amount

    assert transfer("t-1", 10, "bob") == 10
    assert transfer("t-1", 10, "bob") == 10
    with pytest.raises(TokenMismatch) as mismatch:
        transfer("t-1", 99, "bob")
    assert mismatch.value.field == "fingerprint"


def test_a_live_holder_refuses_or_is_waited_for(client: TokenClient) -> None:
    holder = keyed_guard(client, "report.build", "r-1", lease_seconds=30)
    assert holder.start()

    @idempotent(client, "report.build", key="report_id")
    def build(report_id: str) -> str:
        return "built by a duplicate"

    with pytest.raises(TokenInProgress):
        build("r-1")

    @idempotent(client, "report.build", key="report_id", wait_seconds=30)
    def build_waiting(report_id: str) -> str:
        return "built by a duplicate"

    timer = threading.Timer(0.3, holder.succeed, args=("built by the holder",))
    timer.start()
    try:
        assert build_waiting("r-1") == "built by the holder"
    finally:
        timer.join()


def test_a_dead_holder_is_taken_over_after_its_lease_and_fenced_out(client: TokenClient) -> None:
    dead = keyed_guard(client, "job.run", 42, lease_seconds=1)
    assert dead.start()  # ... and its process dies: nothing completes or renews the lease
    dead._stop_renewer()  # what its death does to the background renewal
    calls = Calls()

    @idempotent(client, "job.run", key="job_id", wait_seconds=10)
    def run(job_id: int) -> str:
        calls.hit()
        return "done"

    assert run(42) == "done"  # waited out the dead lease, then took the key over
    assert calls.count == 1
    with pytest.raises(LeaseLost):
        dead.succeed("late")
    assert run(42) == "done"
    assert calls.count == 1


def test_concurrent_duplicates_run_the_body_once_and_share_its_result(client: TokenClient) -> None:
    calls = Calls()
    barrier = threading.Barrier(8)

    @idempotent(client, "batch.import", key="batch_id", wait_seconds=30)
    def import_batch(batch_id: str) -> dict[str, Any]:
        number = calls.hit()
        time.sleep(0.2)  # long enough for every duplicate to arrive while it runs
        return {"run": number}

    results: list[Any] = []

    def worker() -> None:
        barrier.wait()
        results.append(import_batch("b-1"))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert calls.count == 1
    assert results == [{"run": 1}] * 8


def test_keyed_guard_context_manager(client: TokenClient) -> None:
    with keyed_guard(client, "invoice.send", "i-9") as op:
        op.result = {"sent": True}
    assert op.result == {"sent": True}
    with pytest.raises(Replayed) as replay, keyed_guard(client, "invoice.send", "i-9"):
        raise AssertionError("a replay must not run the block")
    assert replay.value.result == {"sent": True}


def test_bad_keys_and_clients_are_refused_before_redis(client: TokenClient) -> None:
    with pytest.raises(ValueError, match="None"):
        operation_token("a.b", None)
    with pytest.raises(TypeError, match="JSON"):
        operation_token("a.b", object())
    with pytest.raises(TypeError, match="no parameter"):
        idempotent(client, "a.b", key="missing")(lambda order_id: None)
    with pytest.raises(TypeError, match="AsyncTokenClient"):

        @idempotent(client, "a.b", key="x")
        async def not_for_a_sync_client(x: int) -> None:
            pass

    with (
        TokenClient("http://token-service", "key") as over_http,
        pytest.raises(TypeError, match="direct transport"),
    ):
        idempotent(over_http, "a.b", key="x")


def test_a_keyed_record_cannot_be_reached_as_a_token(client: TokenClient, raw: Any) -> None:
    """Anyone may know a key (an order id): its record must not be usable as a token anywhere."""

    @idempotent(client, "order.ship", key="order_id")
    def ship(order_id: str) -> str:
        return "shipped"

    ship("o-1")
    name = operation_token("order.ship", "o-1")
    for operation in (client.consume, client.begin):
        with pytest.raises(TokenInvalid):
            operation(name, "order.ship")
    with pytest.raises(TokenInvalid):
        client.verify(name)
    http = httpx.Client(transport=httpx.WSGITransport(app=inproc_app(raw)), base_url="http://t")
    for route in ("consume", "begin"):
        reply = http.post(f"/token/{route}", json={"token": name, "scope": "order.ship"}, headers=AUTH)
        assert reply.status_code in (400, 404)
        assert reply.json()["code"] in ("invalid_request", "token_invalid")


def test_redis_down_fails_closed() -> None:
    # no retries of redis-py's own (its default backs off for seconds): the SDK's are enough here
    unreachable = redis.Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    calls = Calls()
    with TokenClient.from_redis(unreachable, retry=FAST_RETRY) as down:

        @idempotent(down, "a.b", key="x")
        def body(x: int) -> None:
            calls.hit()

        with pytest.raises(ServiceUnavailable):
            body(1)
    assert calls.count == 0


async def test_async_functions_run_once_per_key(async_client: AsyncTokenClient) -> None:
    calls = Calls()

    @idempotent(async_client, "async.job", key="job_id", wait_seconds=30)
    async def job(job_id: str) -> dict[str, int]:
        number = calls.hit()
        await asyncio.sleep(0.2)
        return {"run": number}

    results = await asyncio.gather(*(job("j-1") for _ in range(8)))
    assert results == [{"run": 1}] * 8
    assert await job("j-1") == {"run": 1}
    assert calls.count == 1
    async with keyed_guard(async_client, "async.job", "j-2") as op:
        op.result = "block"
    with pytest.raises(Replayed):
        async with keyed_guard(async_client, "async.job", "j-2"):
            raise AssertionError("a replay must not run the block")


async def test_async_functions_release_record_refuse_and_wait_like_sync_ones(
    async_client: AsyncTokenClient,
) -> None:
    """What the sync tests above show, for coroutine functions (Powertools' #4483 asked for them)."""
    calls = Calls()

    @idempotent(async_client, "async.send", key="invoice_id")
    async def send(invoice_id: str) -> str:
        if calls.hit() == 1:
            raise ConnectionError("smtp down")
        return "sent"

    with pytest.raises(ConnectionError):
        await send("i-1")  # an exception releases the key: the retry runs
    assert [await send("i-1"), await send("i-1")] == ["sent", "sent"]
    assert calls.count == 2

    @idempotent(async_client, "async.charge", key="payment_id", terminal=(Declined,))
    async def charge(payment_id: str) -> str:
        calls.hit()
        raise Declined("card declined")

    with pytest.raises(Declined):
        await charge("p-1")
    with pytest.raises(TokenFailed) as failed:
        await charge("p-1")  # recorded: never runs again
    assert failed.value.error == {"type": "Declined", "message": "card declined"}
    assert calls.count == 3

    @idempotent(async_client, "async.transfer", key="transfer_id", fingerprint=("amount",))
    async def transfer(transfer_id: str, amount: int) -> int:
        return amount

    assert await transfer("t-1", 10) == 10
    with pytest.raises(TokenMismatch):
        await transfer("t-1", 99)

    holder = keyed_guard(async_client, "async.report", "r-1", lease_seconds=30)
    assert await holder.start()

    @idempotent(async_client, "async.report", key="report_id")
    async def build(report_id: str) -> str:
        return "built by a duplicate"

    with pytest.raises(TokenInProgress):
        await build("r-1")

    @idempotent(async_client, "async.report", key="report_id", wait_seconds=30)
    async def build_waiting(report_id: str) -> str:
        return "built by a duplicate"

    async def finish_later() -> None:
        await asyncio.sleep(0.3)
        await holder.succeed("built by the holder")

    waited, _ = await asyncio.gather(build_waiting("r-1"), finish_later())
    assert waited == "built by the holder"


async def test_an_async_dead_holder_is_taken_over_after_its_lease(async_client: AsyncTokenClient) -> None:
    dead = keyed_guard(async_client, "async.job", 7, lease_seconds=1, renew=False)
    assert await dead.start()  # ... and its process dies: nothing completes or renews the lease
    calls = Calls()

    @idempotent(async_client, "async.job", key="job_id", wait_seconds=10)
    async def run(job_id: int) -> str:
        calls.hit()
        return "done"

    assert await run(7) == "done"  # waited out the dead lease, then took the key over
    with pytest.raises(LeaseLost):
        await dead.succeed("late")
    assert (await run(7), calls.count) == ("done", 1)


# -- the Lua contract: begin's claim_ms ----------------------------------------------------


@pytest.fixture
def clocked(raw: Any) -> tuple[TokenStore, list[int]]:
    now = [1_000_000]
    return TokenStore(raw, clock_ms=lambda: now[0]), now


def test_begin_claims_an_absent_record_only_when_asked(clocked: tuple[TokenStore, list[int]]) -> None:
    store, _ = clocked
    with pytest.raises(TokenInvalid):
        store.begin(UseRequest("op:absent", "s.a"))  # a token path: absent is unknown
    started = store.begin(UseRequest("op:absent", "s.a", None, None, "r-1"), 30, 60)
    assert isinstance(started, Started)
    assert store.inspect("op:absent").state == "PROCESSING"


def test_a_claim_with_a_bad_lifetime_writes_nothing(clocked: tuple[TokenStore, list[int]], raw: Any) -> None:
    store, _ = clocked
    for bad in (0, -5):
        with pytest.raises(Exception, match="claim_ms"):
            store.begin(UseRequest("op:x", "s.a", None, None, "r-1"), 30, bad)
    assert raw.dbsize() == 0


def test_a_dead_keyed_holder_past_the_key_lifetime_is_claimed_afresh(
    clocked: tuple[TokenStore, list[int]],
) -> None:
    store, now = clocked
    store.begin(UseRequest("op:k", "s.a", None, None, "r-1"), 5, 2)
    now[0] += 6_000  # the lease and the key's lifetime both ran out (the record is kept for the lease)
    taken = store.begin(UseRequest("op:k", "s.a", None, None, "r-2"), 5, 2)
    assert store.complete("op:k", taken.lease_id, "ok").replayed is False  # type: ignore[union-attr]
    # a token past its own expiry is still gone, as before
    store.begin(UseRequest("op:t", "s.a", None, None, "r-3"), 5, 2)
    now[0] += 6_000
    with pytest.raises(TokenInvalid):
        store.begin(UseRequest("op:t", "s.a"), lease_seconds=5)


def test_the_guard_hooks_reach_keyed_functions(client: TokenClient) -> None:
    """on_replay / on_conflict / on_mismatch of idempotent() and keyed_guard() are the guard's."""
    seen: list[tuple[str, str]] = []

    def hook(name: str) -> Any:
        return lambda guard, *error: seen.append((name, error[0].code if error else guard.scope))

    hooks = {"on_replay": hook("replay"), "on_conflict": hook("conflict"), "on_mismatch": hook("mismatch")}

    @idempotent(client, "invoice.send", key="invoice_id", fingerprint="amount", **hooks)
    def send(invoice_id: int, amount: int) -> str:
        return f"sent {invoice_id}"

    assert send(1, 100) == "sent 1"
    assert send(1, 100) == "sent 1"
    with pytest.raises(TokenMismatch):
        send(1, 999)
    held = keyed_guard(client, "invoice.send", 2, **hooks)
    assert held.start()
    with pytest.raises(TokenInProgress), keyed_guard(client, "invoice.send", 2, **hooks):
        pass
    held.succeed("done")
    assert seen == [
        ("replay", "invoice.send"),
        ("mismatch", "token_mismatch"),
        ("conflict", "token_in_progress"),
    ]


def test_keyed_functions_take_the_hooks_as_one_value_and_refuse_an_unknown_one(client: TokenClient) -> None:
    from token_service.client import GuardHooks

    seen: list[str] = []
    hooks = GuardHooks(on_replay=lambda guard: seen.append("replay"))

    @idempotent(client, "invoice.mail", key="invoice_id", hooks=hooks, on_conflict=lambda g, e: None)
    def mail(invoice_id: int) -> str:
        return f"mailed {invoice_id}"

    assert [mail(1), mail(1)] == ["mailed 1", "mailed 1"]
    with keyed_guard(client, "invoice.mail", 2, hooks=hooks) as op:
        op.result = "mailed 2"
    with pytest.raises(Replayed), keyed_guard(client, "invoice.mail", 2, hooks=hooks):
        pass
    assert seen == ["replay", "replay"]
    with pytest.raises(TypeError, match="on_replays"):
        idempotent(client, "invoice.mail", key="invoice_id", on_replays=print)  # type: ignore[call-arg]
