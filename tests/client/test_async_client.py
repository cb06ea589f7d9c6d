"""AsyncTokenClient and AsyncGuard: every method and error, over every transport."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.support.processes import free_port
from tests.support.sdk import Sdk
from token_service.client import (
    AsyncTokenClient,
    InvalidRequest,
    LeaseLost,
    PayloadTooLarge,
    Replayed,
    RetryPolicy,
    ServiceUnavailable,
    TokenFailed,
    TokenInProgress,
    TokenInvalid,
    TokenMismatch,
    TokenUsed,
)
from token_service.client.advanced import Completed, Consumed, FailRecorded, Finished, Started

SCOPE = "payment.create"


async def test_generate_and_batch(async_sdk: Sdk) -> None:
    client: AsyncTokenClient = async_sdk.client
    issued = await client.generate(SCOPE, subject="u", fingerprint="f", ttl_seconds=90)
    assert (issued.scope, issued.subject, issued.fingerprint, issued.ttl_seconds) == (SCOPE, "u", "f", 90)
    assert issued.expires_at <= datetime.now(UTC) + timedelta(seconds=91)
    batch = await client.generate_batch(SCOPE, 4)
    assert len({item.token for item in batch}) == 4
    info = await client.verify(batch[0].token)
    assert info.state == "ISSUED"


async def test_consume_replay_used_mismatch_invalid(async_sdk: Sdk) -> None:
    client: AsyncTokenClient = async_sdk.client
    token = (await client.generate(SCOPE, subject="u")).token
    with pytest.raises(TokenMismatch) as caught:
        await client.consume(token, SCOPE, subject="v")
    assert caught.value.field == "subject"
    assert await client.consume(token, SCOPE, subject="u", request_id="r") == Consumed(replayed=False)
    assert await client.consume(token, SCOPE, subject="u", request_id="r") == Consumed(replayed=True)
    with pytest.raises(TokenUsed):
        await client.consume(token, SCOPE, subject="u")
    with pytest.raises(TokenInvalid):
        await client.consume("unknown-token-0123456789", SCOPE)
    with pytest.raises(InvalidRequest):
        await client.generate("not a scope")


async def test_two_phase_and_revoke(async_sdk: Sdk) -> None:
    client: AsyncTokenClient = async_sdk.client
    token = (await client.generate(SCOPE)).token
    started = await client.begin(token, SCOPE, request_id="a")
    assert isinstance(started, Started)
    with pytest.raises(TokenInProgress) as caught:
        await client.begin(token, SCOPE, request_id="b")
    assert caught.value.retry_after_seconds >= 1
    with pytest.raises(LeaseLost):
        await client.complete(token, "someone-else", 1)
    assert await client.complete(token, started.lease_id, {"ok": 1}) == Completed(replayed=False)
    assert await client.begin(token, SCOPE) == Finished(result={"ok": 1})
    assert (await client.verify(token)).result == {"ok": 1}
    await client.revoke(token)
    with pytest.raises(TokenInvalid):
        await client.verify(token)


async def test_fail_retryable_and_terminal(async_sdk: Sdk) -> None:
    client: AsyncTokenClient = async_sdk.client
    token = (await client.generate(SCOPE)).token
    first = await client.begin(token, SCOPE)
    assert isinstance(first, Started)
    released = await client.fail(token, first.lease_id, retryable=True)
    assert released == FailRecorded("released", False)
    second = await client.begin(token, SCOPE)
    assert isinstance(second, Started)
    failed = await client.fail(token, second.lease_id, retryable=False, error={"code": "declined"})
    assert failed == FailRecorded("failed", False)
    with pytest.raises(TokenFailed) as caught:
        await client.consume(token, SCOPE)
    assert caught.value.error == {"code": "declined"}


async def test_async_guard_runs_once_and_replays(async_sdk: Sdk) -> None:
    client: AsyncTokenClient = async_sdk.client
    token = (await client.generate(SCOPE)).token
    calls = []

    async def charge(amount: int) -> dict[str, Any]:
        calls.append(amount)
        await asyncio.sleep(0)
        return {"charged": amount}

    assert await client.guard(token, SCOPE).run(charge, 5) == {"charged": 5}
    guard = client.guard(token, SCOPE)
    assert await guard.run(charge, 6) == {"charged": 5}
    assert guard.replayed
    with pytest.raises(Replayed) as replay:
        async with client.guard(token, SCOPE):
            calls.append(7)  # pragma: no cover - a replay never enters the block
    assert replay.value.result == {"charged": 5}
    assert calls == [5]


async def test_async_result_too_large_is_a_terminal_failure(async_sdk: Sdk) -> None:
    client: AsyncTokenClient = async_sdk.client
    token = (await client.generate(SCOPE)).token
    calls = []

    async def render() -> str:
        calls.append(1)
        return "\u4e2d" * 2731  # 6 bytes a character once JSON-encoded: over 16384

    with pytest.raises((InvalidRequest, PayloadTooLarge)):
        await client.guard(token, SCOPE).run(render)
    assert (await client.verify(token)).state == "FAILED"
    with pytest.raises(TokenFailed):
        await client.guard(token, SCOPE).run(render)
    assert calls == [1]


async def test_async_guard_releases_or_records_failures(async_sdk: Sdk) -> None:
    client: AsyncTokenClient = async_sdk.client
    retryable, terminal = await client.generate_batch(SCOPE, 2)
    with pytest.raises(TimeoutError):
        async with client.guard(retryable.token, SCOPE):
            raise TimeoutError("slow bank")
    assert (await client.verify(retryable.token)).state == "ISSUED"
    with pytest.raises(KeyError):
        async with client.guard(terminal.token, SCOPE, terminal=(KeyError,)):
            raise KeyError("no such card")
    info = await client.verify(terminal.token)
    assert info.state == "FAILED"
    assert info.error["type"] == "KeyError"


async def test_async_guarded_decorator_and_waiting(async_sdk: Sdk) -> None:
    client: AsyncTokenClient = async_sdk.client
    calls = []
    running = asyncio.Event()

    @client.guarded(SCOPE)
    async def ship(order: str, token: str) -> str:
        calls.append(order)
        running.set()
        await asyncio.sleep(0.2)
        return f"shipped {order}"

    token = (await client.generate(SCOPE)).token
    # the second caller finds the first in flight and waits for its result
    first = asyncio.create_task(ship("o-1", token))
    # its body runs (a fixed 0.05 s could pass before its begin came back on a loaded machine,
    # and the second caller would take the token first)
    await asyncio.wait_for(running.wait(), 30)
    waiter = client.guard(token, SCOPE, wait_seconds=10)
    assert await waiter.run(ship, "o-2", token) == "shipped o-1"
    assert await first == "shipped o-1"
    assert calls == ["o-1"]

    with pytest.raises(TypeError):
        client.guarded(SCOPE)(lambda token: token)  # a plain function needs the sync client


async def test_async_direct_redis_down_is_unavailable() -> None:
    client = AsyncTokenClient.from_redis(
        f"redis://127.0.0.1:{free_port()}/0", timeout=0.5, retry=RetryPolicy(2, backoff_seconds=0.001)
    )
    async with client:
        with pytest.raises(ServiceUnavailable):
            await client.generate(SCOPE)


async def test_async_http_down_is_unavailable() -> None:
    client = AsyncTokenClient(f"http://127.0.0.1:{free_port()}", "key", timeout=0.5, retry=2)
    async with client:
        with pytest.raises(ServiceUnavailable):
            await client.consume("well-formed-token-0123456789", SCOPE)
