"""The guard's engine (client/_engine.py): one set of decisions, driven with blocking calls
(Guard) or awaited (AsyncGuard).

Each scenario is one script of store replies, played to a Guard and to an AsyncGuard over the
same scripted client: both must make the same calls, in the same order, with the same
arguments, and end the same way (result, error, the token's lease state). The guards' own tests
(test_guard.py, test_outcome_blips.py, test_keyed.py) show the decisions against real stores;
this holds the two drivers to each other. Keyed operations: a guard's client is the direct
transport's keyed records, not a second TokenClient.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from token_service.client import AsyncGuard, Guard, TokenClient
from token_service.client._client import KeyedCalls, keyed_calls
from token_service.client._engine import drive
from token_service.errors import (
    LeaseLost,
    PayloadTooLarge,
    ServiceUnavailable,
    TokenFailed,
    TokenInProgress,
    TokenMismatch,
)
from token_service.records import Completed, FailRecorded, Finished, Started

Reply = Any  # a value to return, or an exception to raise


class Scripted:
    """A GuardClient answering each call with the next reply its script has for that operation;
    every call is recorded (operation and arguments, the request id left out: it is random)."""

    def __init__(self, script: dict[str, list[Reply]]) -> None:
        self.script = {name: list(replies) for name, replies in script.items()}
        self.calls: list[tuple[Any, ...]] = []

    def answer(self, name: str, *args: Any) -> Any:
        self.calls.append((name, *args))
        reply = self.script[name].pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def begin(self, token: str, scope: str, **options: Any) -> Any:
        return self.answer("begin", token, scope, options["lease_seconds"])

    def renew(self, token: str, lease_id: str, *, lease_seconds: int | None = None) -> Any:
        return self.answer("renew", token, lease_id)

    def complete(self, token: str, lease_id: str, result: Any = None) -> Any:
        return self.answer("complete", token, lease_id, result)

    def fail(self, token: str, lease_id: str, *, retryable: bool = True, error: Any = None) -> Any:
        return self.answer("fail", token, lease_id, retryable, error)


class AsyncScripted(Scripted):
    async def begin(self, token: str, scope: str, **options: Any) -> Any:  # type: ignore[override]
        return super().begin(token, scope, **options)

    async def renew(self, token: str, lease_id: str, *, lease_seconds: int | None = None) -> Any:  # type: ignore[override]
        return super().renew(token, lease_id)

    async def complete(self, token: str, lease_id: str, result: Any = None) -> Any:  # type: ignore[override]
        return super().complete(token, lease_id, result)

    async def fail(self, token: str, lease_id: str, *, retryable: bool = True, error: Any = None) -> Any:  # type: ignore[override]
        return super().fail(token, lease_id, retryable=retryable, error=error)


LEASE = Started("lease-1", 0, lease_seconds=30.0)
BUSY = TokenInProgress("held", retry_after_seconds=0)
DOWN = ServiceUnavailable("no reply")


def _work(value: Any) -> Callable[[], Any]:
    def work() -> Any:
        if isinstance(value, BaseException):
            raise value
        return value

    return work


def _sync(script: dict[str, list[Reply]], work: Any, **options: Any) -> tuple[list[Any], Any, Any]:
    client = Scripted(script)
    guard = Guard(client, "tok", "a.b", renew=False, **options)
    try:
        outcome: Any = ("result", guard.run(_work(work)))
    except BaseException as exc:
        outcome = ("raised", type(exc).__name__, getattr(exc, "operation", None))
    return client.calls, outcome, guard.lease


def _async(script: dict[str, list[Reply]], work: Any, **options: Any) -> tuple[list[Any], Any, Any]:
    client = AsyncScripted(script)
    guard = AsyncGuard(client, "tok", "a.b", renew=False, **options)

    async def work_async() -> Any:
        return _work(work)()

    async def run() -> Any:
        try:
            return ("result", await guard.run(work_async))
        except BaseException as exc:
            return ("raised", type(exc).__name__, getattr(exc, "operation", None))

    outcome = asyncio.run(run())
    return client.calls, outcome, guard.lease


SCENARIOS: dict[str, tuple[dict[str, list[Reply]], Any, dict[str, Any]]] = {
    "first run": ({"begin": [LEASE], "complete": [Completed(False)]}, {"ok": 1}, {}),
    "replay": ({"begin": [Finished({"ok": 1})]}, "never", {}),
    "a live holder waited out, then replayed": (
        {"begin": [BUSY, BUSY, Finished([1, 2])]},
        "never",
        {"wait_seconds": 30},
    ),
    "a live holder not waited for": ({"begin": [BUSY]}, "never", {}),
    "a mismatch": ({"begin": [TokenMismatch("other", field="fingerprint")]}, "never", {}),
    "a terminal failure found": ({"begin": [TokenFailed("failed", error={"e": 1})]}, "never", {}),
    "the store down as complete is sent, then back": (
        {"begin": [LEASE], "complete": [DOWN, DOWN, Completed(False)]},
        "done",
        {},
    ),
    "the store down for the whole lease at complete": (
        {"begin": [Started("lease-1", 0, lease_seconds=1.0)], "complete": [DOWN] * 200},
        "done",
        {},
    ),
    "the lease lost before complete": ({"begin": [LEASE], "complete": [LeaseLost("gone")]}, "done", {}),
    "a result the store refuses: recorded as a terminal failure": (
        {"begin": [LEASE], "complete": [PayloadTooLarge("big")], "fail": [FailRecorded("failed", False)]},
        "x",
        {},
    ),
    "the work raises: released": (
        {"begin": [LEASE], "fail": [FailRecorded("released", False)]},
        RuntimeError("boom"),
        {},
    ),
    "the work raises a terminal error: recorded": (
        {"begin": [LEASE], "fail": [FailRecorded("failed", False)]},
        KeyError("k"),
        {"terminal": (KeyError,)},
    ),
    "the work raises and the store is down for the release": (
        {"begin": [Started("lease-1", 0, lease_seconds=1.0)], "fail": [DOWN] * 200},
        RuntimeError("boom"),
        {},
    ),
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_sync_and_async_guards_make_the_same_calls_and_end_alike(name: str) -> None:
    script, work, options = SCENARIOS[name]
    sync_calls, sync_outcome, sync_lease = _sync(script, work, **options)
    async_calls, async_outcome, async_lease = _async(script, work, **options)
    assert sync_calls == async_calls
    assert sync_outcome == async_outcome
    assert sync_lease is async_lease is None  # every path ends the lease it took (or took none)
    assert sync_calls[0][0] == "begin"


def test_what_each_scenario_decides() -> None:
    """The shared answers are the right ones (not merely equal): a few read back."""
    assert _sync(*SCENARIOS["replay"][:2])[1] == ("result", {"ok": 1})
    calls, outcome, _ = _sync(*SCENARIOS["the store down as complete is sent, then back"][:2])
    assert [call[0] for call in calls] == ["begin", "complete", "complete", "complete"]
    assert outcome == ("result", "done")
    calls, outcome, _ = _sync(*SCENARIOS["the store down for the whole lease at complete"][:2])
    assert outcome == ("raised", "OutcomeNotRecorded", "complete")
    assert calls[1][0] == "complete"
    assert len(calls) < 200
    calls, outcome, _ = _sync(*SCENARIOS["a result the store refuses: recorded as a terminal failure"][:2])
    assert calls[-1][0] == "fail"
    assert calls[-1][3] is False
    assert outcome == ("raised", "PayloadTooLarge", None)
    calls, outcome, _ = _sync(
        *SCENARIOS["the work raises a terminal error: recorded"][:2], terminal=(KeyError,)
    )
    assert calls[-1][3] is False
    assert calls[-1][4] == {"type": "KeyError", "message": "'k'"}
    calls, outcome, _ = _sync(*SCENARIOS["the work raises: released"][:2])
    assert calls[-1][3] is True
    assert outcome == ("raised", "RuntimeError", None)
    calls, _, _ = _sync(*SCENARIOS["a live holder waited out, then replayed"][:2], wait_seconds=30)
    assert [call[0] for call in calls] == ["begin", "begin", "begin"]


def test_a_flow_sees_each_error_where_it_made_the_call() -> None:
    """drive() throws a call's error into the flow at its yield, so the flow's own except clauses
    decide (here: a retry after ServiceUnavailable), and returns what the flow returns."""
    seen: list[str] = []

    def flow() -> Any:
        try:
            yield _work(DOWN)
        except ServiceUnavailable:
            seen.append("caught")
        pause = yield 0.0  # a pause is slept and answered None
        return ("done", pause, (yield lambda: 7))

    assert drive(flow()) == ("done", None, 7)
    assert seen == ["caught"]


def test_a_keyed_guard_calls_the_direct_transports_keyed_records_with_its_clients_retries() -> None:
    import fakeredis

    client = TokenClient.from_redis(fakeredis.FakeRedis())
    calls = keyed_calls(client, 60)
    assert isinstance(calls, KeyedCalls)
    assert not isinstance(calls, TokenClient)  # no second client, no stand-in transport
    assert not hasattr(calls, "consume")
    assert not hasattr(calls, "issue")
    assert calls.telemetry is client.telemetry
    assert calls.records.keep_seconds >= 60
    with pytest.raises(TypeError, match="direct transport"):
        keyed_calls(TokenClient("http://127.0.0.1:9"), 60)
