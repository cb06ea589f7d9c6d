"""The testing kit's fixtures, as a user's suite gets them from the plugin (no conftest here).

Each asserts what production would answer: the kit runs the shipped Lua on
fakeredis, with the store's clock moved by the test.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

import pytest

from token_service.client import (
    AsyncTokenClient,
    Replayed,
    ServiceUnavailable,
    TokenClient,
    TokenInProgress,
    TokenInvalid,
    TokenUsed,
    idempotent,
    keyed_guard,
)
from token_service.client.advanced import Consumed, Finished, Started
from token_service.errors import LeaseLost
from token_service.testing import InMemoryStore, StoreClock, StoreFaults

SCOPE = "payment.create"


def test_token_client_is_the_sdks_client_on_an_empty_store(token_client: TokenClient) -> None:
    assert isinstance(token_client, TokenClient)
    token = token_client.generate(SCOPE, subject="ada").token
    assert token_client.consume(token, SCOPE, subject="ada") == Consumed(replayed=False)
    with pytest.raises(TokenUsed):
        token_client.consume(token, SCOPE, subject="ada")


def test_each_test_starts_on_an_empty_store(token_store: InMemoryStore) -> None:
    assert token_store.redis().dbsize() == 0
    token_store.client().generate(SCOPE)
    assert token_store.redis().dbsize() == 1


def test_and_the_next_one_too(token_store: InMemoryStore) -> None:
    # the same store object serves the process; what the test before left is gone
    assert token_store.redis().dbsize() == 0
    assert token_store.clock.offset_seconds == 0


def test_a_token_expires_when_the_clock_passes_its_ttl(
    token_client: TokenClient, token_clock: StoreClock
) -> None:
    token = token_client.generate(SCOPE, ttl_seconds=3600).token
    token_clock.advance(3000)  # 600 s to spare: however slow the machine, still issued
    assert token_client.verify(token).state == "ISSUED"
    token_clock.advance(timedelta(seconds=600.5))
    with pytest.raises(TokenInvalid):
        token_client.consume(token, SCOPE)


def test_a_stored_result_is_forgotten_after_result_ttl(token_store: InMemoryStore) -> None:
    client = token_store.client(result_ttl_seconds=3600)
    runs: list[str] = []

    # a finished key is kept for the longer of its own ttl and the store's result_ttl
    @idempotent(client, "order.ship", key="order_id", ttl_seconds=600)
    def ship(order_id: str) -> str:
        runs.append(order_id)
        return f"shipped {order_id}"

    assert ship("o-1") == ship("o-1") == "shipped o-1"
    assert runs == ["o-1"]
    token_store.clock.advance(3000)
    ship("o-1")
    assert runs == ["o-1"]
    token_store.clock.advance(601)
    ship("o-1")  # the key's record is gone: a new call runs again, as it would on Redis
    assert runs == ["o-1", "o-1"]


def test_a_lease_lapses_on_the_clock_and_the_late_holder_is_fenced_out(
    token_client: TokenClient, token_clock: StoreClock
) -> None:
    token = token_client.generate(SCOPE).token
    first = token_client.begin(token, SCOPE, lease_seconds=10)
    assert isinstance(first, Started)
    with pytest.raises(TokenInProgress):
        token_client.begin(token, SCOPE, lease_seconds=10)
    token_clock.advance(10.01)
    second = token_client.begin(token, SCOPE, lease_seconds=10)
    assert isinstance(second, Started)
    assert second.lease_id != first.lease_id
    with pytest.raises(LeaseLost):
        token_client.complete(token, first.lease_id, {"charged": 1})
    token_client.complete(token, second.lease_id, {"charged": 2})
    replay = token_client.begin(token, SCOPE)
    assert isinstance(replay, Finished)
    assert replay.result == {"charged": 2}


def test_advancing_inside_a_guard_is_a_stall_past_the_lease(
    token_client: TokenClient, token_clock: StoreClock
) -> None:
    token = token_client.generate(SCOPE).token
    guard = token_client.guard(token, SCOPE, lease_seconds=5)
    assert guard.start()
    token_clock.advance(6)  # the renewer saw no time pass: the store did
    token_client.begin(token, SCOPE)  # a duplicate takes the lapsed lease over
    with pytest.raises(LeaseLost):
        guard.succeed("charged")


def test_store_down_raises_service_unavailable_without_sleeping(
    token_client: TokenClient, token_faults: StoreFaults
) -> None:
    token = token_client.generate(SCOPE).token
    with token_faults.store_down():
        assert token_faults.down
        with pytest.raises(ServiceUnavailable):
            token_client.consume(token, SCOPE)
        with pytest.raises(ServiceUnavailable):
            token_client.generate(SCOPE)
    assert not token_faults.down
    # fail closed: the consume that met the outage used nothing
    assert token_client.consume(token, SCOPE) == Consumed(replayed=False)


def test_store_down_blocks_nest(token_client: TokenClient, token_faults: StoreFaults) -> None:
    with token_faults.store_down():
        with token_faults.store_down():
            pass
        with pytest.raises(ServiceUnavailable):
            token_client.generate(SCOPE)
    token_client.generate(SCOPE)


def test_an_operation_in_flight_elsewhere_then_its_result(
    token_client: TokenClient, token_faults: StoreFaults
) -> None:
    token = token_client.generate(SCOPE, subject="ada").token
    holder = token_faults.in_flight(token, SCOPE, subject="ada")
    with pytest.raises(TokenInProgress) as refused:
        token_client.guard(token, SCOPE, subject="ada").run(lambda: "charged twice")
    assert refused.value.retry_after_seconds > 0
    holder.finish({"receipt": "r-1"})
    with pytest.raises(Replayed) as replayed, token_client.guard(token, SCOPE, subject="ada"):
        pass
    assert replayed.value.result == {"receipt": "r-1"}


def test_a_crashed_holder_is_taken_over_and_cannot_record(
    token_client: TokenClient, token_faults: StoreFaults
) -> None:
    token = token_client.generate(SCOPE).token
    holder = token_faults.in_flight(token, SCOPE, lease_seconds=20)
    holder.crash()
    assert token_client.guard(token, SCOPE).run(lambda: "charged once") == "charged once"
    with pytest.raises(LeaseLost):
        holder.finish("charged by the dead")


def test_a_keyed_operation_in_flight_and_its_holder_crashing(
    token_client: TokenClient, token_faults: StoreFaults
) -> None:
    runs: list[str] = []

    @idempotent(token_client, "order.ship", key="order_id")
    def ship(order_id: str) -> str:
        runs.append(order_id)
        return "shipped"

    holder = token_faults.in_flight_key("order.ship", "o-7")
    with pytest.raises(TokenInProgress):
        ship("o-7")
    assert ship("o-8") == "shipped"  # another key runs
    holder.crash()
    assert ship("o-7") == "shipped"
    assert runs == ["o-8", "o-7"]


def test_a_holder_that_fails_for_good(token_client: TokenClient, token_faults: StoreFaults) -> None:
    holder = token_faults.in_flight_key("invoice.send", 42)
    holder.fail(retryable=False, error={"reason": "card declined"})
    from token_service.client import TokenFailed

    with pytest.raises(TokenFailed) as failed, keyed_guard(token_client, "invoice.send", 42):
        pass
    assert failed.value.error == {"reason": "card declined"}


async def test_async_token_client_on_the_tests_loop(
    async_token_client: AsyncTokenClient, token_clock: StoreClock, token_faults: StoreFaults
) -> None:
    assert isinstance(async_token_client, AsyncTokenClient)
    token = (await async_token_client.generate(SCOPE, ttl_seconds=30)).token
    async with async_token_client.guard(token, SCOPE) as guard:
        guard.result = "charged"
    assert (await async_token_client.verify(token)).state == "SUCCEEDED"
    other = (await async_token_client.generate(SCOPE, ttl_seconds=30)).token
    token_clock.advance(31)
    with pytest.raises(TokenInvalid):
        await async_token_client.consume(other, SCOPE)
    with token_faults.store_down(), pytest.raises(ServiceUnavailable):
        await async_token_client.generate(SCOPE)


def test_threads_racing_one_token_on_token_client(token_client: TokenClient) -> None:
    token = token_client.generate(SCOPE).token
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def click() -> None:
        barrier.wait()
        try:
            token_client.consume(token, SCOPE)
            outcomes.append("won")
        except TokenUsed:
            outcomes.append("used")

    threads = [threading.Thread(target=click) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["used"] * 7 + ["won"]


def test_the_clock_can_be_moved_from_another_thread(
    token_client: TokenClient, token_clock: StoreClock
) -> None:
    token = token_client.generate(SCOPE, ttl_seconds=5).token
    mover = threading.Thread(target=token_clock.advance, args=(6,))
    mover.start()
    mover.join(30)
    with pytest.raises(TokenInvalid):
        token_client.verify(token)


def test_other_fakeredis_servers_keep_the_real_time(token_store: InMemoryStore) -> None:
    import fakeredis

    other = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    other.set("k", "v", ex=60)
    token_store.clock.advance(3600)
    assert other.get("k") == b"v"
    seconds, _ = other.time()
    kit_seconds, _ = token_store.redis().time()
    assert kit_seconds - seconds >= 3599


def test_asyncio_run_outside_pytest_asyncio() -> None:
    store = InMemoryStore()

    async def main() -> str:
        client = store.async_client()
        token = (await client.generate(SCOPE)).token
        await client.consume(token, SCOPE)
        return (await client.verify(token)).state

    assert asyncio.run(main()) == "CONSUMED"


def test_an_outage_while_the_outcome_is_stored_is_outcome_not_recorded(
    token_client: TokenClient, token_faults: StoreFaults
) -> None:
    # the guard keeps trying while its lease can be held, on the real clock: a short lease here
    from token_service.client import OutcomeNotRecorded

    token = token_client.generate(SCOPE).token
    guard = token_client.guard(token, SCOPE, lease_seconds=1)
    assert guard.start()  # the work runs ...
    with token_faults.store_down(), pytest.raises(OutcomeNotRecorded) as lost:
        guard.succeed("charged")  # ... and its outcome meets the outage
    assert lost.value.result == "charged"
    assert token_client.verify(token).state == "PROCESSING"  # a crashed holder, to the token
