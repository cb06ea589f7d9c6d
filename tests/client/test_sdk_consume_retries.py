"""The SDK's consume: its retries (attempts, backoff, one request id) and remembered scopes.

TokenClient.consume retries through _call with the same request id on
every attempt. The scope check remembers scopes that passed. (The store's shortcuts:
tests/test_store_consume_shortcuts.py.)
"""

from __future__ import annotations

import pytest

from token_service.client import ServiceUnavailable, TokenClient
from token_service.client import _validate as check
from token_service.client._types import RetryPolicy
from token_service.errors import InvalidRequest
from token_service.records import Consumed, UseRequest


def test_checked_scopes_are_remembered_but_never_a_wrong_one() -> None:
    class Sneaky(str):
        __slots__ = ()

    assert check.scope("payment.create") == "payment.create"
    assert check.scope("payment.create") == "payment.create"  # now from the cache
    for bad in ["", ".x", "a" * 65, "pay ment", "x\n", None, 7, b"payment.create"]:
        with pytest.raises(InvalidRequest) as refused:
            check.scope(bad)
        assert refused.value.errors == {"scope": [check.SCOPE_RULE]}
    # a str subclass is checked every time, and never enters the cache
    assert check.scope(Sneaky("payment.create")) == "payment.create"
    assert not any(type(s) is not str for s in check._VALID_SCOPES)


def test_the_scope_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(check, "_VALID_SCOPES", set())
    for n in range(check._MAX_VALID_SCOPES + 50):
        check.scope(f"scope-{n}")
    assert len(check._VALID_SCOPES) == check._MAX_VALID_SCOPES
    assert check.scope("scope-10000") == "scope-10000"  # past the bound: still checked and accepted


class FlakyBackend:
    """A transport whose consume fails ``failures`` times with ServiceUnavailable, then wins."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: list[UseRequest] = []
        self.raised: list[ServiceUnavailable] = []

    def consume(self, use: UseRequest) -> Consumed:
        self.calls.append(use)
        if len(self.calls) <= self.failures:
            error = ServiceUnavailable(f"attempt {len(self.calls)}")
            self.raised.append(error)
            raise error
        return Consumed(replayed=len(self.calls) > 1)


@pytest.mark.parametrize("attempts", [1, 2, 4])
@pytest.mark.parametrize("failures", [0, 1, 3, 5])
def test_sdk_consume_retries_as_the_policy_says_with_one_request_id(
    monkeypatch: pytest.MonkeyPatch, attempts: int, failures: int
) -> None:
    slept: list[float] = []
    monkeypatch.setattr("token_service.client._client.time.sleep", slept.append)
    backend = FlakyBackend(failures)
    policy = RetryPolicy(attempts=attempts, backoff_seconds=0.01, max_backoff_seconds=1.0)
    client = TokenClient(retry=policy, _backend=backend)  # type: ignore[arg-type]
    if failures < attempts:
        assert client.consume("t" * 43, "s", subject="u") == Consumed(replayed=failures > 0)
        assert len(backend.calls) == failures + 1
    else:
        with pytest.raises(ServiceUnavailable) as raised:
            client.consume("t" * 43, "s", subject="u")
        assert raised.value is backend.raised[-1]  # the last failure, as it was raised
        assert len(backend.calls) == attempts
    assert len({call.request_id for call in backend.calls}) == 1  # every attempt resends the same id
    first = backend.calls[0]
    assert (first.token, first.scope, first.subject, first.fingerprint) == ("t" * 43, "s", "u", None)
    assert len(first.request_id or "") == 32
    # one backoff between attempts, growing: failure n waits within [c/2, c], c = 0.01 * 2**(n-1)
    assert len(slept) == len(backend.calls) - 1
    for n, delay in enumerate(slept, start=1):
        ceiling = 0.01 * 2 ** (n - 1)
        assert ceiling / 2 <= delay <= ceiling


def test_sdk_consume_keeps_the_callers_request_id_across_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("token_service.client._client.time.sleep", lambda seconds: None)
    backend = FlakyBackend(2)
    client = TokenClient(retry=3, _backend=backend)  # type: ignore[arg-type]
    assert client.consume("t" * 43, "s", request_id="order-17") == Consumed(replayed=True)
    assert [call.request_id for call in backend.calls] == ["order-17"] * 3
