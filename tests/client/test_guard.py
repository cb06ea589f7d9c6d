"""The two-phase guard (context manager, run, decorator), over every transport."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from tests.support.sdk import Sdk
from token_service.client import (
    InvalidRequest,
    PayloadTooLarge,
    Replayed,
    TokenClient,
    TokenError,
    TokenFailed,
    TokenInProgress,
    TokenUsed,
)
from token_service.client.advanced import Started

SCOPE = "order.place"


class CardDeclined(Exception):
    pass


class Counter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, value: Any = "done") -> Any:
        self.calls += 1
        return value


def test_run_executes_once_and_replays_the_stored_result(sdk: Sdk) -> None:
    token = sdk.client.generate(SCOPE).token
    body = Counter()
    first = sdk.client.guard(token, SCOPE).run(body, {"order": 7, "lines": (1, 2)})
    assert first == {"order": 7, "lines": [1, 2]}  # the JSON form, as duplicates will see it
    guard = sdk.client.guard(token, SCOPE)
    assert guard.run(body, {"order": 8}) == first
    assert guard.replayed
    assert body.calls == 1
    assert sdk.client.verify(token).result == first


def test_context_manager_stores_what_the_block_sets(sdk: Sdk) -> None:
    token = sdk.client.generate(SCOPE, subject="alice").token
    body = Counter()
    with sdk.client.guard(token, SCOPE, subject="alice") as guard:
        guard.result = body({"receipt": "r-1"})
    assert guard.result == {"receipt": "r-1"}
    for _ in range(2):
        with pytest.raises(Replayed) as replay, sdk.client.guard(token, SCOPE, subject="alice"):
            body({"receipt": "r-2"})  # pragma: no cover - a replay never enters the block
        assert replay.value.result == {"receipt": "r-1"}
    assert body.calls == 1
    assert sdk.client.verify(token).result == {"receipt": "r-1"}


def test_a_replay_never_runs_the_block_nor_overwrites_the_result(sdk: Sdk) -> None:
    token = sdk.client.generate(SCOPE).token
    charges: list[int] = []
    replays: list[Any] = []
    for attempt in range(2):
        try:
            with sdk.client.guard(token, SCOPE) as guard:
                charges.append(attempt)
                guard.result = {"charge": attempt}
        except Replayed as replay:
            replays.append(replay.result)
    assert charges == [0]
    assert replays == [{"charge": 0}]
    assert sdk.client.verify(token).result == {"charge": 0}
    replayed = sdk.client.guard(token, SCOPE)
    assert replayed.start() is False
    with pytest.raises(AttributeError, match="read-only"):
        replayed.result = {"charge": 99}
    assert replayed.result == {"charge": 0}


def test_replayed_is_exported_and_not_a_token_error() -> None:
    assert not issubclass(Replayed, TokenError)
    assert Replayed({"x": 1}).result == {"x": 1}


def test_a_result_too_large_for_the_store_is_a_terminal_failure(sdk: Sdk) -> None:
    token = sdk.client.generate(SCOPE).token
    body = Counter()
    too_large = "\u4e2d" * 2731  # 8 KiB of text, but 6 bytes a character as the store's JSON
    with pytest.raises((InvalidRequest, PayloadTooLarge)):
        # the default lease: a 1 s one could run out on a loaded machine before the failure is recorded
        sdk.client.guard(token, SCOPE).run(body, too_large)
    info = sdk.client.verify(token)
    assert info.state == "FAILED"  # never reopened: the body ran, it must not run again
    with pytest.raises(TokenFailed):
        sdk.client.guard(token, SCOPE).run(body, "again")
    assert body.calls == 1


def test_guarded_refuses_one_request_id_for_every_call(sdk: Sdk) -> None:
    with pytest.raises(TypeError, match="request_id"):
        sdk.client.guarded(SCOPE, request_id="same-for-all")


def test_an_exception_releases_the_token_for_a_retry(sdk: Sdk) -> None:
    token = sdk.client.generate(SCOPE).token

    def flaky() -> None:
        raise TimeoutError("upstream timed out")

    with pytest.raises(TimeoutError):
        sdk.client.guard(token, SCOPE).run(flaky)
    assert sdk.client.verify(token).state == "ISSUED"
    with pytest.raises(TimeoutError), sdk.client.guard(token, SCOPE):
        raise TimeoutError("again")
    assert sdk.client.verify(token).state == "ISSUED"
    assert sdk.client.guard(token, SCOPE).run(lambda: "second try") == "second try"


def test_terminal_exceptions_record_the_failure(sdk: Sdk) -> None:
    token = sdk.client.generate(SCOPE).token

    def charge() -> None:
        raise CardDeclined("insufficient funds")

    with pytest.raises(CardDeclined):
        sdk.client.guard(token, SCOPE, terminal=(CardDeclined,)).run(charge)
    body = Counter()
    with pytest.raises(TokenFailed) as caught:
        sdk.client.guard(token, SCOPE).run(body)
    assert caught.value.error == {"type": "CardDeclined", "message": "insufficient funds"}
    assert body.calls == 0


def test_terminal_may_be_a_predicate(sdk: Sdk) -> None:
    permanent, transient = sdk.client.generate_batch(SCOPE, 2)

    def is_permanent(exc: BaseException) -> bool:
        return "permanent" in str(exc)

    for issued, message in ((permanent, "permanent refusal"), (transient, "try later")):
        with (
            pytest.raises(ValueError, match=message),
            sdk.client.guard(issued.token, SCOPE, terminal=is_permanent),
        ):
            raise ValueError(message)
    assert sdk.client.verify(permanent.token).state == "FAILED"
    assert sdk.client.verify(transient.token).state == "ISSUED"


def test_a_result_that_is_not_json_fails_for_good(sdk: Sdk) -> None:
    token = sdk.client.generate(SCOPE).token
    with pytest.raises(TypeError, match="JSON"):
        sdk.client.guard(token, SCOPE).run(lambda: object())
    # it ran once: never again
    assert sdk.client.verify(token).state == "FAILED"


def test_a_consumed_token_cannot_be_guarded(sdk: Sdk) -> None:
    token = sdk.client.generate(SCOPE).token
    sdk.client.consume(token, SCOPE)
    body = Counter()
    with pytest.raises(TokenUsed):
        sdk.client.guard(token, SCOPE).run(body)
    assert body.calls == 0


def test_guarded_decorator_reads_the_token_argument(sdk: Sdk) -> None:
    calls: list[tuple[str, int]] = []

    @sdk.client.guarded(SCOPE, token_arg="idem", subject=lambda user, amount, idem: user)
    def pay(user: str, amount: int, idem: str) -> dict[str, Any]:
        calls.append((user, amount))
        return {"paid": amount, "user": user}

    token = sdk.client.generate(SCOPE, subject="bob").token
    assert pay("bob", 10, idem=token) == {"paid": 10, "user": "bob"}
    assert pay("bob", 10, token) == {"paid": 10, "user": "bob"}
    assert calls == [("bob", 10)]


def test_guarded_rejects_a_function_without_the_token_parameter(sdk: Sdk) -> None:
    with pytest.raises(TypeError, match="no parameter 'token'"):
        sdk.client.guarded(SCOPE)(lambda amount: amount)


def test_a_waiting_guard_gets_the_result_of_the_live_holder(sdk: Sdk) -> None:
    token = sdk.client.generate(SCOPE).token
    holder = sdk.client.begin(token, SCOPE)
    assert isinstance(holder, Started)
    with pytest.raises(TokenInProgress):
        sdk.client.guard(token, SCOPE).run(Counter())

    def finish_soon() -> None:
        time.sleep(0.3)
        sdk.client.complete(token, holder.lease_id, {"by": "holder"})

    finisher = threading.Thread(target=finish_soon)
    finisher.start()
    body = Counter()
    try:
        assert sdk.client.guard(token, SCOPE, wait_seconds=10).run(body) == {"by": "holder"}
    finally:
        finisher.join()
    assert body.calls == 0


class CountingConnection(redis.Connection):
    """Counts the requests the client sends (a pipeline or a script is one)."""

    sent = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sent += 1
        super().send_packed_command(command, check_health)


@pytest.mark.real
def test_a_replay_costs_one_round_trip_on_the_direct_transport(real_redis: redis.Redis) -> None:
    port = real_redis.connection_pool.connection_kwargs["port"]
    pool = redis.ConnectionPool(port=port, connection_class=CountingConnection)
    counted = redis.Redis(connection_pool=pool)
    client = TokenClient.from_redis(counted)
    token = client.generate(SCOPE).token
    client.guard(token, SCOPE).run(lambda: {"stored": True})
    before = CountingConnection.sent
    body = Counter()
    assert client.guard(token, SCOPE).run(body) == {"stored": True}
    assert CountingConnection.sent - before == 1
    assert body.calls == 0
    counted.close()
