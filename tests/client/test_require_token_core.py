"""The decisions of ``client/_require_token_core.py`` on their own: the body-fit rule, and streamed
bodies settled once whether they end, are closed early, raise or are cancelled.

The three decorators' answers are held to each other by tests/integrations/test_require_token_parity.py;
these pin the rule itself with a guard that only records what it was told.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from token_service.client._require_token_core import Replay, Reply, RequireToken, ValueReply
from token_service.client.guard import AsyncGuard, Guard
from token_service.errors import ServiceUnavailable
from token_service.records import Finished


class Told(Guard):
    """What a guard was told: ``("succeed", result)`` or ``("abandon", retryable)``."""

    def __init__(
        self, fail_with: Exception | None = None, terminal: tuple[type[BaseException], ...] = ()
    ) -> None:
        self.said: list[tuple[str, Any]] = []
        self.fail_with = fail_with
        self.terminal = terminal

    def succeed(self, result: Any) -> Any:
        if self.fail_with is not None:
            raise self.fail_with
        self.said.append(("succeed", result))
        return result

    def abandon_quietly(self, exc: BaseException | None, *, retryable: bool | None = None) -> None:
        self.said.append(("abandon", retryable))


class AsyncTold:
    def __init__(self) -> None:
        self.said: list[tuple[str, Any]] = []

    async def succeed(self, result: Any) -> Any:
        self.said.append(("succeed", result))
        return result

    async def abandon_quietly(self, exc: BaseException | None, *, retryable: bool | None = None) -> None:
        self.said.append(("abandon", retryable))


def as_guard(told: Told) -> Guard:
    return told


def as_async_guard(told: AsyncTold) -> AsyncGuard:
    return told  # type: ignore[return-value]


CORE = RequireToken("op", replay_headers=("Content-Type",), max_body_bytes=100, max_result_bytes=200)


def test_a_body_is_kept_only_within_both_caps() -> None:
    headers = [("Content-Type", "text/plain"), ("X-Other", "1")]
    assert CORE.result(Reply(200, headers, b"a" * 100)) == {
        "s": 200,
        "h": [["Content-Type", "text/plain"]],
        "b": "a" * 100,
    }
    # over max_body_bytes raw: omitted, with its real length
    assert CORE.result(Reply(200, headers, b"a" * 101)) == {
        "s": 200,
        "h": [["Content-Type", "text/plain"]],
        "omitted": 101,
    }
    # within max_body_bytes raw (99 bytes) but over max_result_bytes as the store counts JSON
    # (33 CJK characters: 6 bytes each once ASCII-escaped)
    cjk = "\u4e2d" * 33
    assert CORE.result(Reply(200, headers, cjk.encode()))["omitted"] == 99  # type: ignore[index]
    # a value: the same rule on its JSON form
    value = CORE.result(ValueReply(None, headers, {"v": "x" * 200}))
    assert value is not None
    assert value["omitted"] == len('{"v":"' + "x" * 200 + '"}')
    assert CORE.result(ValueReply(201, headers, {"v": 1}))["v"] == {"v": 1}  # type: ignore[index]


def test_the_storage_policy_frees_the_token() -> None:
    for status in (401, 407, 408, 409, 425, 429, 500, 503):
        assert CORE.result(Reply(status, [], b"x")) is None
    # the view's own 403 is its answer (the user is known, and may not): kept, as Django's PermissionDenied
    assert CORE.result(Reply(403, [], b"x")) is not None
    told = Told()
    CORE.settle(as_guard(told), Reply(503, [], b"down"))
    assert told.said == [("abandon", True)]


class NotFound(Exception):
    """A framework's HTTP exception, as the adapters declare theirs (``http_errors``)."""


def test_a_raised_http_exception_is_settled_as_the_response_it_stands_for() -> None:
    core = RequireToken("op", http_errors=(NotFound,))
    page = Reply(404, [("Content-Type", "text/plain")], b"no such order")
    told = Told()
    core.raised(as_guard(told), NotFound(), lambda: page)
    assert told.said == [("succeed", {"s": 404, "h": [], "b": "no such order"})]  # kept: replayed
    told = Told()
    core.raised(as_guard(told), NotFound(), lambda: Reply(503, [], b"down"))
    assert told.said == [("abandon", True)]  # the storage policy frees a 503, as a returned one
    told = Told()
    core.raised(as_guard(told), NotFound(), lambda: None)
    assert told.said == [("abandon", True)]  # not renderable: freed


def test_terminal_wins_over_an_http_exception_and_other_exceptions_are_failures() -> None:
    core = RequireToken("op", http_errors=(NotFound,))
    told = Told(terminal=(NotFound,))
    assert not core.answered(as_guard(told), NotFound())
    core.raised(as_guard(told), NotFound(), lambda: pytest.fail("a terminal exception is not rendered"))
    assert told.said == [("abandon", None)]  # the guard records it (terminal)
    told = Told()
    assert not core.answered(as_guard(told), RuntimeError())
    assert not CORE.answered(as_guard(told), NotFound())  # not one of this core's http_errors


async def test_an_async_guard_settles_a_raised_http_exception_alike() -> None:
    core = RequireToken("op", http_errors=(NotFound,))

    async def page() -> Reply:
        return Reply(404, [], b"gone")

    told = AsyncTold()
    guard = as_async_guard(told)
    guard.is_terminal = lambda exc: False  # type: ignore[method-assign]
    await core.araised(guard, NotFound(), page)
    await core.araised(guard, RuntimeError("bug"), page)
    assert told.said == [("succeed", {"s": 404, "h": [], "b": "gone"}), ("abandon", None)]


def test_a_store_that_fails_after_the_work_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    told = Told(fail_with=ServiceUnavailable("redis down"))
    CORE.settle(as_guard(told), Reply(200, [], b"ok"))
    assert "could not store the response of a op request" in caplog.text


def chunks(count: int, *, then_raise: bool = False) -> Iterator[bytes]:
    for number in range(count):
        yield b"%09d\n" % number
    if then_raise:
        raise RuntimeError("the stream broke")


def test_a_stream_is_settled_once_at_its_end_or_when_closed_or_freed_when_it_raises() -> None:
    told = Told()
    recording = CORE.record(as_guard(told), chunks(3), Reply(200, [("Content-Type", "text/plain")]), None)
    assert b"".join(recording) == b"".join(chunks(3))
    recording.close()
    assert told.said == [("succeed", {"s": 200, "h": [["Content-Type", "text/plain"]], "b": "".join(
        f"{n:09d}\n" for n in range(3)
    )})]  # fmt: skip

    told = Told()
    recording = CORE.record(as_guard(told), chunks(20), Reply(200, []), None)
    iterator = iter(recording)
    next(iterator)
    recording.close()  # the client left after the first chunk: what went out, as omitted
    assert told.said == [("succeed", {"s": 200, "h": [], "omitted": 10})]

    told = Told()
    with pytest.raises(RuntimeError):
        list(CORE.record(as_guard(told), chunks(2, then_raise=True), Reply(200, []), None))
    assert told.said == [("abandon", True)]

    told = Told()
    over = CORE.record(as_guard(told), chunks(20), Reply(200, []), None)
    assert len(b"".join(over)) == 200
    assert told.said == [("succeed", {"s": 200, "h": [], "omitted": 200})]


async def achunks(
    count: int, *, then_raise: bool = False, pause: asyncio.Event | None = None
) -> AsyncIterator[bytes]:
    for number in range(count):
        if pause is not None and number == 1:
            await pause.wait()
        yield b"%09d\n" % number
    if then_raise:
        raise RuntimeError("the stream broke")


async def test_an_async_stream_is_settled_once_whatever_ends_it() -> None:
    told = AsyncTold()
    sent = [chunk async for chunk in CORE.arecord(as_async_guard(told), achunks(3), Reply(200, []), None)]
    assert b"".join(sent) == b"".join(chunks(3))
    assert told.said == [("succeed", {"s": 200, "h": [], "b": "".join(f"{n:09d}\n" for n in range(3))})]

    told = AsyncTold()
    iterator = CORE.arecord(as_async_guard(told), achunks(20), Reply(200, []), None).__aiter__()
    await anext(iterator)
    await iterator.aclose()  # type: ignore[attr-defined]  # the client left
    assert told.said == [("succeed", {"s": 200, "h": [], "omitted": 10})]

    told = AsyncTold()
    with pytest.raises(RuntimeError):
        [
            chunk
            async for chunk in CORE.arecord(
                as_async_guard(told), achunks(2, then_raise=True), Reply(200, []), None
            )
        ]
    assert told.said == [("abandon", True)]

    # cancelled while it waits for its next chunk (a server stopping the request): still settled
    told = AsyncTold()
    pause, first_out = asyncio.Event(), asyncio.Event()

    async def consume() -> None:
        async for _ in CORE.arecord(as_async_guard(told), achunks(5, pause=pause), Reply(200, []), None):
            first_out.set()

    task = asyncio.ensure_future(consume())
    await asyncio.wait_for(first_out.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert told.said == [("succeed", {"s": 200, "h": [], "omitted": 10})]


def test_a_synchronous_guard_settles_an_async_stream() -> None:
    """Django: a sync view may answer with an async stream (Django serves it on its event loop)."""
    told = Told()

    async def drain() -> bytes:
        return b"".join(
            [chunk async for chunk in CORE.arecord(as_guard(told), achunks(2), Reply(200, []), None)]
        )

    assert asyncio.run(drain()) == b"".join(chunks(2))
    assert told.said[0][0] == "succeed"


class ReplayingClient:
    """A client whose every begin finds a stored result; it keeps the guards it made."""

    def __init__(self) -> None:
        self.guards: list[Guard] = []

    def guard(self, token: str, scope: str, **options: Any) -> Guard:
        made = Guard(self, token, scope, **options)  # type: ignore[arg-type]  # only begin is called
        self.guards.append(made)
        return made

    def begin(self, token: str, scope: str, **options: Any) -> Finished:
        return Finished(result={"ok": True})


def test_the_hooks_are_one_value_built_once_and_handed_to_every_guard() -> None:
    # as @idempotent does (guard.py's docs say both do): not four keywords folded again per request
    replays: list[Any] = []
    options = {"lease_seconds": None, "terminal": (), "wait_seconds": 0.0}
    # a decorator's locals(): hooks= and the hooks given by name, in its **options
    core = RequireToken.of(
        {"scope": "op", "options": {**options, "hooks": None, "on_replay": replays.append}}
    )
    client = ReplayingClient()
    assert isinstance(core.begin(client, "t-1", None, None), Replay)
    assert isinstance(core.begin(client, "t-2", None, None), Replay)
    first, second = client.guards
    assert replays == [first, second]
    assert first.hooks is second.hooks
    assert first.hooks.on_replay == replays.append
