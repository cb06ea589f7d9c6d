"""Typed results round-trip exactly to duplicates; hooks run when a call is answered without running.

The unit part (dump_result / load_result) is pure; the guard part runs on every
transport (the ``sdk`` fixture: fakeredis, real redis-server, HTTP in-process
and under gunicorn), so the typed value survives the real store and the JSON API.
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pydantic
import pytest

from tests.support.sdk import Sdk
from token_service.client import (
    AsyncTokenClient,
    GuardHooks,
    Replayed,
    TokenClient,
    TokenFailed,
    TokenInProgress,
    TokenMismatch,
    TokenUsed,
)
from token_service.client._typed_results import dump_result, load_result

SCOPE = "payment.create"


class Currency(enum.Enum):
    EUR = "EUR"
    USD = "USD"


@dataclass(frozen=True)
class Line:
    sku: str
    quantity: int
    unit_price: Decimal


@dataclass(frozen=True)
class Receipt:
    charge_id: str
    amount_cents: int
    currency: Currency
    lines: tuple[Line, ...]
    tags: frozenset[str] = frozenset()
    paid_at: dt.datetime | None = None
    refund_of: uuid.UUID | None = None
    by_sku: dict[str, int] = field(default_factory=dict)


class Invoice(pydantic.BaseModel):
    number: str
    total: Decimal
    due: dt.date
    lines: list[tuple[str, int]]


RECEIPT = Receipt(
    charge_id="ch_1",
    amount_cents=2500,
    currency=Currency.EUR,
    lines=(Line("A-1", 2, Decimal("10.00")), Line("B-2", 1, Decimal("5.00"))),
    tags=frozenset({"web", "first"}),
    paid_at=dt.datetime(2026, 12, 1, 9, 30, tzinfo=dt.UTC),
    refund_of=uuid.UUID("12345678-1234-5678-1234-567812345678"),
    by_sku={"A-1": 2, "B-2": 1},
)
INVOICE = Invoice(number="INV-7", total=Decimal("25.00"), due=dt.date(2026, 12, 31), lines=[("A-1", 2)])


@pytest.mark.parametrize(
    ("value", "declared"),
    [
        (RECEIPT, Receipt),
        (INVOICE, Invoice),
        ((1, "two", 3.0), tuple[int, str, float]),
        ((1, 2, 3), tuple[int, ...]),
        ({1: Currency.USD}, dict[int, Currency]),
        ({Currency.EUR: [1, 2]}, dict[Currency, list[int]]),
        ([RECEIPT, None], list[Receipt | None]),
        ({"a", "b"}, set[str]),
        (None, Receipt | None),
        (dt.time(12, 0), dt.time),
        ({"plain": [1, {"json": True}]}, dict[str, Any]),
    ],
)
def test_values_round_trip_through_json(value: Any, declared: Any) -> None:
    import json

    stored = json.loads(json.dumps(dump_result(value)))  # what the store keeps
    assert load_result(stored, declared) == value
    assert type(load_result(stored, declared)) is type(value)


def test_without_a_type_duplicates_get_the_json_form() -> None:
    assert load_result(dump_result((1, 2)), None) == [1, 2]
    assert load_result(dump_result(RECEIPT), None)["lines"][0] == {
        "sku": "A-1",
        "quantity": 2,
        "unit_price": "10.00",
    }


def test_what_cannot_be_stored_is_refused() -> None:
    with pytest.raises(TypeError):
        dump_result(object())
    with pytest.raises(TypeError):
        dump_result({(1, 2): "tuple keys"})


def test_dict_keys_are_written_as_json_writes_them() -> None:
    keys = {7: "a", 2.5: "b", False: "c", None: "d"}
    assert dump_result(keys) == {"7": "a", "2.5": "b", "false": "c", "null": "d"}


def test_a_result_that_contains_itself_is_a_terminal_failure_not_a_second_run(sdk: Sdk) -> None:
    client: TokenClient = sdk.client
    token = client.generate(SCOPE).token
    looped: list[Any] = []
    looped.append(looped)
    runs: list[int] = []

    def work() -> list[Any]:
        runs.append(1)
        return looped

    with pytest.raises(TypeError, match="storable"):
        client.guard(token, SCOPE).run(work)
    with pytest.raises(TokenFailed):  # recorded: a duplicate does not run the work again
        client.guard(token, SCOPE).run(work)
    assert runs == [1]


def test_a_stored_value_that_does_not_read_as_the_type_is_refused() -> None:
    with pytest.raises((TypeError, ValueError)):
        load_result({"charge_id": "x"}, tuple[int, int])
    with pytest.raises(ValueError, match="holds 2 items"):
        load_result([1, 2, 3], tuple[int, int])


# -- through a guard, on every transport ------------------------------------------------------


def charge(amount_cents: int) -> Receipt:
    return RECEIPT


def test_a_dataclass_result_round_trips_to_duplicates(sdk: Sdk) -> None:
    client: TokenClient = sdk.client
    token = client.generate(SCOPE).token
    first = client.guard(token, SCOPE).run(charge, 2500)  # the type comes from charge's annotation
    assert first == RECEIPT
    assert isinstance(first, Receipt)
    duplicate = client.guard(token, SCOPE).run(charge, 2500)
    assert duplicate == RECEIPT
    assert isinstance(duplicate.lines, tuple)
    assert isinstance(duplicate.lines[0].unit_price, Decimal)
    assert duplicate.currency is Currency.EUR
    with pytest.raises(Replayed) as replay, client.guard(token, SCOPE, result_type=Receipt):
        pass
    assert replay.value.result == RECEIPT


def test_guarded_reads_the_return_annotation(sdk: Sdk) -> None:
    client: TokenClient = sdk.client
    runs: list[int] = []

    @client.guarded("invoice.create")
    def create_invoice(number: str, token: str) -> tuple[Invoice, int]:
        runs.append(1)
        return INVOICE, 7

    token = client.generate("invoice.create").token
    assert create_invoice("INV-7", token=token) == (INVOICE, 7)
    again = create_invoice("INV-7", token=token)
    assert again == (INVOICE, 7)
    assert isinstance(again, tuple)
    assert isinstance(again[0], Invoice)
    assert runs == [1]


async def test_async_guard_round_trips_a_dataclass(async_sdk: Sdk) -> None:
    client: AsyncTokenClient = async_sdk.client
    token = (await client.generate(SCOPE)).token

    async def charge_async(amount_cents: int) -> Receipt:
        return RECEIPT

    assert await client.guard(token, SCOPE).run(charge_async, 2500) == RECEIPT
    duplicate = await client.guard(token, SCOPE).run(charge_async, 2500)
    assert duplicate == RECEIPT
    assert isinstance(duplicate, Receipt)


def test_a_class_defined_in_a_function_warns_once_and_gives_the_json_form(fake_redis: Any) -> None:
    """This module has ``from __future__ import annotations``: ``-> Local`` is the string
    "Local", which the module's globals do not have. Plain JSON then, said once, not in silence."""
    import warnings

    from token_service.client.advanced import UnresolvedResultType

    @dataclass(frozen=True)
    class Local:
        charge_id: str

    def charge_local() -> Local:
        return Local("ch_9")

    client = TokenClient.from_redis(fake_redis)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # what a user's program has: each location once
        results = []
        for _ in range(3):
            token = client.generate(SCOPE).token
            client.guard(token, SCOPE).run(charge_local)
            results.append(client.guard(token, SCOPE).run(charge_local))  # the duplicate
    assert results == [{"charge_id": "ch_9"}] * 3
    [warning] = caught
    assert warning.category is UnresolvedResultType
    assert "charge_local" in str(warning.message)
    assert "result_type=" in str(warning.message)
    assert warning.filename == __file__
    # with the type given, the class comes back
    token = client.generate(SCOPE).token
    client.guard(token, SCOPE, result_type=Local).run(charge_local)
    assert client.guard(token, SCOPE, result_type=Local).run(charge_local) == Local("ch_9")


# -- hooks ------------------------------------------------------------------------------------


def test_hooks_see_replays_conflicts_and_mismatches(sdk: Sdk) -> None:
    client: TokenClient = sdk.client
    seen: list[tuple[str, Any]] = []
    hooks: dict[str, Any] = {
        "on_replay": lambda guard: seen.append(("replay", guard.result)),
        "on_conflict": lambda guard, error: seen.append(("conflict", type(error))),
        "on_mismatch": lambda guard, error: seen.append(("mismatch", error.field)),
    }
    token = client.generate(SCOPE, subject="alice").token
    held = client.guard(token, SCOPE, subject="alice", **hooks)
    assert held.start()
    with pytest.raises(TokenInProgress):
        client.guard(token, SCOPE, subject="alice", **hooks).start()
    with pytest.raises(TokenMismatch):
        client.guard(token, SCOPE, subject="mallory", **hooks).start()
    held.succeed({"ok": True})
    assert client.guard(token, SCOPE, subject="alice", **hooks).run(lambda: "not run") == {"ok": True}
    used = client.generate(SCOPE).token
    client.consume(used, SCOPE)
    with pytest.raises(TokenUsed):
        client.guard(used, SCOPE, **hooks).run(lambda: "not run")
    assert seen == [
        ("conflict", TokenInProgress),
        ("mismatch", "subject"),
        ("replay", {"ok": True}),
        ("conflict", TokenUsed),
    ]


def test_a_hook_may_raise_its_own_error(sdk: Sdk) -> None:
    client: TokenClient = sdk.client

    class Duplicate(Exception):
        pass

    def refuse(guard: Any, error: Exception) -> None:
        raise Duplicate("already being processed") from error

    token = client.generate(SCOPE).token
    assert client.guard(token, SCOPE).start()
    with pytest.raises(Duplicate):
        client.guard(token, SCOPE, on_conflict=refuse).start()


def test_the_hooks_are_one_value_and_a_hook_given_by_name_wins(fake_redis: Any) -> None:
    client = TokenClient.from_redis(fake_redis)
    seen: list[str] = []
    hooks = GuardHooks(
        on_replay=lambda guard: seen.append("replay"),
        on_conflict=lambda guard, error: seen.append("conflict"),
    )
    token = client.generate(SCOPE).token
    assert client.guard(token, SCOPE, hooks=hooks).run(lambda: "paid") == "paid"
    assert client.guard(token, SCOPE, hooks=hooks).run(lambda: "not run") == "paid"
    named = client.guard(token, SCOPE, hooks=hooks, on_replay=lambda guard: seen.append("named replay"))
    assert named.run(lambda: "not run") == "paid"
    assert seen == ["replay", "named replay"]
    with pytest.raises(TypeError, match="on_replays"):
        client.guard(token, SCOPE, on_replays=lambda guard: None)  # type: ignore[call-arg]


def test_a_terminal_failure_is_a_conflict_for_duplicates(sdk: Sdk) -> None:
    client: TokenClient = sdk.client
    conflicts: list[Any] = []
    token = client.generate(SCOPE).token

    def declined() -> None:
        raise ValueError("declined")

    with pytest.raises(ValueError, match="declined"):
        client.guard(token, SCOPE, terminal=(ValueError,)).run(declined)
    with pytest.raises(TokenFailed):
        client.guard(token, SCOPE, on_conflict=lambda guard, error: conflicts.append(error.error)).run(
            declined
        )
    assert conflicts == [{"type": "ValueError", "message": "declined"}]


def test_require_token_passes_its_hooks_to_the_guard(fake_redis: Any) -> None:
    from flask import Flask

    from token_service.client.flask import require_token

    client = TokenClient.from_redis(fake_redis)
    seen: list[str] = []
    app = Flask(__name__)

    @app.post("/pay")
    @require_token(
        client,
        SCOPE,
        subject=lambda request: request.headers.get("X-User"),
        on_replay=lambda guard: seen.append("replay"),
        on_conflict=lambda guard, error: seen.append(error.code),
        on_mismatch=lambda guard, error: seen.append("mismatch"),
    )
    def pay() -> Any:
        return {"paid": True}, 201

    http = app.test_client()
    token = client.generate(SCOPE, subject="alice").token
    assert http.post("/pay", headers={"Idempotency-Token": token, "X-User": "alice"}).status_code == 201
    replay = http.post("/pay", headers={"Idempotency-Token": token, "X-User": "alice"})
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert http.post("/pay", headers={"Idempotency-Token": token, "X-User": "mallory"}).status_code == 403
    used = client.generate(SCOPE, subject="alice").token
    client.consume(used, SCOPE, subject="alice")
    assert http.post("/pay", headers={"Idempotency-Token": used, "X-User": "alice"}).status_code == 409
    assert seen == ["replay", "mismatch", "token_used"]


def test_require_token_takes_the_hooks_as_one_value_and_refuses_an_unknown_one(fake_redis: Any) -> None:
    from flask import Flask

    from token_service.client.flask import require_token

    client = TokenClient.from_redis(fake_redis)
    seen: list[str] = []
    app = Flask(__name__)

    @app.post("/pay")
    @require_token(client, SCOPE, hooks=GuardHooks(on_replay=lambda guard: seen.append("replay")))
    def pay() -> Any:
        return {"paid": True}, 201

    token = client.generate(SCOPE).token
    for _ in range(2):
        app.test_client().post("/pay", headers={"Idempotency-Token": token})
    assert seen == ["replay"]
    with pytest.raises(TypeError, match="on_replays"):
        require_token(client, SCOPE, on_replays=print)  # type: ignore[call-arg]
