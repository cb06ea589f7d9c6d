"""Every TokenClient method and error, over every transport (see conftest.TRANSPORTS)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.support.sdk import Sdk
from token_service.client import (
    InvalidRequest,
    LeaseLost,
    TokenFailed,
    TokenInProgress,
    TokenInvalid,
    TokenMismatch,
    TokenUsed,
)
from token_service.client.advanced import Completed, Consumed, FailRecorded, Finished, IssuedToken, Started
from token_service.tokens import record_key

SCOPE = "payment.create"


def test_generate_returns_a_bound_token(sdk: Sdk) -> None:
    issued = sdk.client.generate(SCOPE, subject="user-1", fingerprint="order-9", ttl_seconds=120)
    assert isinstance(issued, IssuedToken)
    assert (issued.scope, issued.subject, issued.fingerprint, issued.ttl_seconds) == (
        SCOPE,
        "user-1",
        "order-9",
        120,
    )
    now = datetime.now(UTC)
    assert now + timedelta(seconds=100) < issued.expires_at <= now + timedelta(seconds=121)
    assert "***" in repr(issued)
    assert issued.token not in repr(issued)
    # only the digest is at rest
    assert sdk.redis.exists(record_key("ts:", issued.token)) == 1
    assert issued.token.encode() not in b"".join(sdk.redis.keys("*"))
    assert 0 < sdk.redis.pttl(record_key("ts:", issued.token)) <= 120_000


def test_generate_uses_the_default_ttl(sdk: Sdk) -> None:
    assert sdk.client.generate(SCOPE).ttl_seconds == 300


def test_generate_batch_issues_distinct_tokens(sdk: Sdk) -> None:
    batch = sdk.client.generate_batch(SCOPE, 5, subject="user-1")
    assert len({issued.token for issued in batch}) == 5
    assert all(issued.subject == "user-1" and issued.scope == SCOPE for issued in batch)
    assert all(sdk.client.verify(issued.token).state == "ISSUED" for issued in batch)


def test_consume_wins_once_and_a_retry_with_the_same_request_id_wins_again(sdk: Sdk) -> None:
    token = sdk.client.generate(SCOPE, subject="u").token
    assert sdk.client.consume(token, SCOPE, subject="u", request_id="req-1") == Consumed(replayed=False)
    assert sdk.client.consume(token, SCOPE, subject="u", request_id="req-1") == Consumed(replayed=True)
    with pytest.raises(TokenUsed):
        sdk.client.consume(token, SCOPE, subject="u", request_id="req-2")
    with pytest.raises(TokenUsed):
        sdk.client.consume(token, SCOPE, subject="u")  # a generated request id is never another's
    assert sdk.client.verify(token).state == "CONSUMED"


def test_mismatch_names_the_field_and_does_not_use_the_token(sdk: Sdk) -> None:
    token = sdk.client.generate(SCOPE, subject="u", fingerprint="f").token
    for kwargs, field in (
        ({"scope": "other.scope", "subject": "u", "fingerprint": "f"}, "scope"),
        ({"scope": SCOPE, "subject": "v", "fingerprint": "f"}, "subject"),
        ({"scope": SCOPE, "subject": "u", "fingerprint": None}, "fingerprint"),
    ):
        with pytest.raises(TokenMismatch) as caught:
            sdk.client.consume(token, **kwargs)
        assert caught.value.field == field
        assert caught.value.status == 403
    assert sdk.client.consume(token, SCOPE, subject="u", fingerprint="f").replayed is False


@pytest.mark.parametrize("token", ["unknown-token-0123456789abcdef", "not a token!", "x" * 200])
def test_unknown_or_malformed_tokens_are_invalid(sdk: Sdk, token: str) -> None:
    with pytest.raises(TokenInvalid):
        sdk.client.consume(token, SCOPE)
    with pytest.raises(TokenInvalid):
        sdk.client.verify(token)
    with pytest.raises(TokenInvalid):
        sdk.client.begin(token, SCOPE)


def test_verify_changes_nothing(sdk: Sdk) -> None:
    token = sdk.client.generate(SCOPE, subject="u", fingerprint="f", ttl_seconds=60).token
    key = record_key("ts:", token)
    before = sdk.redis.get(key)
    info = sdk.client.verify(token)
    assert (info.state, info.scope, info.subject, info.fingerprint) == ("ISSUED", SCOPE, "u", "f")
    assert info.expires_at <= datetime.now(UTC) + timedelta(seconds=61)
    assert info.result is None
    assert info.error is None
    assert info.lease_expires_at is None
    assert sdk.redis.get(key) == before
    assert sdk.client.verify(token).state == "ISSUED"


def test_revoke_makes_a_token_invalid(sdk: Sdk) -> None:
    token = sdk.client.generate(SCOPE).token
    assert sdk.client.revoke(token) is None
    with pytest.raises(TokenInvalid):
        sdk.client.verify(token)
    with pytest.raises(TokenInvalid):
        sdk.client.consume(token, SCOPE)
    with pytest.raises(TokenInvalid):
        sdk.client.revoke(token)


def test_two_phase_success_stores_the_result_for_duplicates(sdk: Sdk) -> None:
    token = sdk.client.generate(SCOPE).token
    started = sdk.client.begin(token, SCOPE, request_id="first", lease_seconds=30)
    assert isinstance(started, Started)
    assert not started.replayed
    lease_expires = datetime.fromtimestamp(started.lease_expires_ms / 1000, UTC)
    assert (
        datetime.now(UTC) + timedelta(seconds=25) < lease_expires < datetime.now(UTC) + timedelta(seconds=31)
    )

    # the same request retrying its begin gets its own lease back
    again = sdk.client.begin(token, SCOPE, request_id="first")
    assert isinstance(again, Started)
    assert again.replayed
    assert again.lease_id == started.lease_id

    with pytest.raises(TokenInProgress) as caught:
        sdk.client.begin(token, SCOPE, request_id="second")
    assert 1 <= caught.value.retry_after_seconds <= 30
    with pytest.raises(TokenInProgress):
        sdk.client.consume(token, SCOPE)
    processing = sdk.client.verify(token)
    assert processing.state == "PROCESSING"
    assert processing.lease_expires_at is not None

    result = {"charge": "ch_1", "amount": 1250, "items": [1, 2]}
    assert sdk.client.complete(token, started.lease_id, result) == Completed(replayed=False)
    assert sdk.client.complete(token, started.lease_id, result) == Completed(replayed=True)
    assert sdk.client.begin(token, SCOPE, request_id="third") == Finished(result=result)
    info = sdk.client.verify(token)
    assert info.state == "SUCCEEDED"
    assert info.result == result
    with pytest.raises(TokenUsed):
        sdk.client.consume(token, SCOPE)


def test_retryable_failure_releases_the_token(sdk: Sdk) -> None:
    token = sdk.client.generate(SCOPE).token
    started = sdk.client.begin(token, SCOPE)
    assert isinstance(started, Started)
    released = sdk.client.fail(token, started.lease_id, retryable=True, error={"why": "timeout"})
    assert released == FailRecorded(outcome="released", replayed=False)
    assert sdk.client.verify(token).state == "ISSUED"
    # a fresh begin takes it over; the old lease can no longer finish it
    retry = sdk.client.begin(token, SCOPE)
    assert isinstance(retry, Started)
    assert retry.lease_id != started.lease_id
    with pytest.raises(LeaseLost):
        sdk.client.complete(token, started.lease_id, {"late": True})


def test_terminal_failure_is_reported_with_the_stored_error(sdk: Sdk) -> None:
    token = sdk.client.generate(SCOPE).token
    started = sdk.client.begin(token, SCOPE)
    assert isinstance(started, Started)
    error = {"type": "CardDeclined", "message": "insufficient funds"}
    failed = sdk.client.fail(token, started.lease_id, retryable=False, error=error)
    assert failed == FailRecorded(outcome="failed", replayed=False)
    for use in (lambda: sdk.client.begin(token, SCOPE), lambda: sdk.client.consume(token, SCOPE)):
        with pytest.raises(TokenFailed) as caught:
            use()
        assert caught.value.error == error
        assert caught.value.status == 409
    info = sdk.client.verify(token)
    assert info.state == "FAILED"
    assert info.error == error


def test_a_foreign_lease_is_lost(sdk: Sdk) -> None:
    token = sdk.client.generate(SCOPE).token
    assert isinstance(sdk.client.begin(token, SCOPE), Started)
    with pytest.raises(LeaseLost):
        sdk.client.complete(token, "not-the-lease", {"x": 1})
    with pytest.raises(LeaseLost):
        sdk.client.fail(token, "not-the-lease", retryable=True)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda c, t: c.generate("bad scope!"), "scope"),
        (lambda c, t: c.generate("ok", subject="x" * 129), "subject"),
        (lambda c, t: c.generate("ok", ttl_seconds=0), "ttl_seconds"),
        (lambda c, t: c.generate_batch("ok", 1001), "count"),
        (lambda c, t: c.consume(t, "ok", fingerprint="tab\there"), "fingerprint"),
        (lambda c, t: c.begin(t, "ok", lease_seconds=100_000), "lease_seconds"),
    ],
)
def test_invalid_arguments_are_invalid_requests(sdk: Sdk, call, field: str) -> None:  # type: ignore[no-untyped-def]
    token = sdk.client.generate("ok").token
    with pytest.raises(InvalidRequest) as caught:
        call(sdk.client, token)
    assert field in caught.value.errors
    assert sdk.client.verify(token).state == "ISSUED"  # nothing was burnt


@pytest.mark.parametrize(
    ("call", "fields"),
    [
        (lambda c, t: c.generate("bad scope!", ttl_seconds=0), {"scope", "ttl_seconds"}),
        (
            lambda c, t: c.generate_batch("bad scope!", 1001, subject="x" * 129),
            {"scope", "count", "subject"},
        ),
        (lambda c, t: c.consume(t, "bad scope!", fingerprint="tab\there"), {"scope", "fingerprint"}),
    ],
)
def test_every_invalid_argument_is_named_at_once(sdk: Sdk, call, fields: set[str]) -> None:  # type: ignore[no-untyped-def]
    # over HTTP and straight to Redis alike (the direct transport stopped at the first)
    token = sdk.client.generate("ok").token
    with pytest.raises(InvalidRequest) as caught:
        call(sdk.client, token)
    assert set(caught.value.errors) == fields


def test_a_result_too_large_to_store_is_refused_and_the_lease_kept(sdk: Sdk) -> None:
    token = sdk.client.generate(SCOPE).token
    started = sdk.client.begin(token, SCOPE)
    assert isinstance(started, Started)
    with pytest.raises(InvalidRequest) as caught:
        sdk.client.complete(token, started.lease_id, "x" * 20_000)
    assert "result" in caught.value.errors
    assert sdk.client.complete(token, started.lease_id, "small") == Completed(replayed=False)
