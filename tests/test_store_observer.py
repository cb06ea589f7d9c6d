"""The store's observer: told once per operation what came of it (the service's metrics and
access log hang on it), on fakeredis and real Redis, sync and asyncio."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio

from tests.support.processes import RedisServer
from token_service import records
from token_service.config import RateLimit
from token_service.errors import OutstandingCapReached, RateLimited, TokenUsed
from token_service.limits import IssuanceLimits
from token_service.records import IssueRequest, UseRequest
from token_service.scripts import ADMIT_ISSUE
from token_service.store import AsyncTokenStore, TokenStore
from token_service.tokens import token_digest

SCOPE = "payment.create"
PAY = IssueRequest(SCOPE, "user-1", None, 60)


class Seen(list[tuple[str, Any, Any, Any]]):
    """What the observer was told: (operation, scope, digest, outcome or exception)."""

    def __call__(self, operation: str, scope: str | None, digest: str | None, outcome: Any) -> None:
        self.append((operation, scope, digest, outcome))


def test_each_operation_is_told_once_with_its_outcome(redis_client: Any) -> None:
    seen = Seen()
    store = TokenStore(redis_client, observer=seen)
    token, other = store.issue(PAY, 2)
    assert seen.pop() == ("issue", SCOPE, None, [token, other])
    digest = token_digest(token)

    assert store.consume(UseRequest(token, SCOPE, "user-1", None, "r-1")) == records.Consumed(replayed=False)
    assert seen.pop() == ("consume", SCOPE, digest, records.Consumed(replayed=False))
    store.consume(UseRequest(token, SCOPE, "user-1", None, "r-1"))
    assert seen.pop() == ("consume", SCOPE, digest, records.Consumed(replayed=True))
    with pytest.raises(TokenUsed) as used:
        store.consume(UseRequest(token, SCOPE, "user-1", None, "r-2"))
    assert seen.pop() == ("consume", SCOPE, digest, used.value)  # the exception raised, as raised

    started = store.begin(UseRequest(other, SCOPE, "user-1", None, "r-3"))
    assert isinstance(started, records.Started)
    assert seen.pop() == ("begin", SCOPE, token_digest(other), started)
    store.renew(other, started.lease_id, 30)
    store.complete(other, started.lease_id, {"id": 7})
    store.begin(UseRequest(other, SCOPE, "user-1", None, "r-4"))
    store.inspect(other)
    store.revoke(other)
    assert [(name, scope, digest) for name, scope, digest, _ in seen] == [
        ("renew", None, token_digest(other)),
        ("complete", None, token_digest(other)),
        ("begin", SCOPE, token_digest(other)),
        ("inspect", None, token_digest(other)),
        ("revoke", None, token_digest(other)),
    ]
    outcomes = [outcome for *_, outcome in seen]
    assert outcomes[2] == records.Finished(result={"id": 7})
    assert isinstance(outcomes[3], records.Inspection)
    assert outcomes[4] is None  # revoke returns nothing


def test_issuing_is_told_as_issued_or_refused(redis_client: Any) -> None:
    seen = Seen()
    store = TokenStore(redis_client, observer=seen)
    limits = IssuanceLimits(RateLimit(100, 60), max_outstanding=2)
    issued = store.admit_and_issue("ts:c:x", limits, PAY, 2)
    assert seen.pop() == (ADMIT_ISSUE, SCOPE, None, issued)
    with pytest.raises(OutstandingCapReached) as refused:
        store.admit_and_issue("ts:c:x", limits, PAY, 1)
    assert seen.pop() == (ADMIT_ISSUE, SCOPE, None, refused.value)
    with pytest.raises(RateLimited) as again:
        store.admit("ts:c:x", limits, 1, 60)
    assert seen.pop() == ("admit", None, None, again.value)
    assert seen == []


def test_an_observed_operation_digests_its_token_once(redis_client: Any, digests: list[str]) -> None:
    # once for the record key and the observer both (the access log names the token by it)
    store = TokenStore(redis_client, observer=Seen())
    [token] = store.issue(PAY)
    digests.clear()
    store.consume(UseRequest(token, SCOPE, "user-1"))
    assert digests == [token]
    with pytest.raises(TokenUsed):  # and the key it made was this token's own
        store.consume(UseRequest(token, SCOPE, "user-1"))


@pytest.mark.real
def test_the_async_store_is_observed_alike(real_redis: Any, redis_server: RedisServer) -> None:
    seen = Seen()

    async def run() -> None:
        client = redis.asyncio.Redis.from_url(redis_server.url)
        store = AsyncTokenStore(client, observer=seen)
        try:
            [token] = await store.issue(PAY)
            await store.consume(UseRequest(token, SCOPE, "user-1", None, "r-1"))
            with pytest.raises(TokenUsed):
                await store.consume(UseRequest(token, SCOPE, "user-1", None, "r-2"))
        finally:
            await client.aclose()
        assert [(name, scope, digest) for name, scope, digest, _ in seen] == [
            ("issue", SCOPE, None),
            ("consume", SCOPE, token_digest(token)),
            ("consume", SCOPE, token_digest(token)),
        ]
        assert seen[1][3] == records.Consumed(replayed=False)
        assert isinstance(seen[2][3], TokenUsed)

    asyncio.run(run())
