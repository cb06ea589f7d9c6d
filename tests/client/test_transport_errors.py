"""Errors and retries at the transport edge.

The HTTP transport turns every problem+json ``code`` into its class (checked
against a mock server answering each code, and against the real app for the
codes it can be driven to), and transport failures into retries that resend
the same request id. The direct transport turns a dead Redis into
ServiceUnavailable after its retries.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import httpx
import pytest

from tests.support.processes import REPO_ROOT, free_port
from tests.support.sdk import inproc_app
from tests.support.service import API_KEY, FAST_RETRY
from token_service.client import (
    AsyncTokenClient,
    InvalidRequest,
    LeaseLost,
    PayloadTooLarge,
    RateLimited,
    RetryPolicy,
    ServiceUnavailable,
    TokenClient,
    TokenError,
    TokenFailed,
    TokenInProgress,
    TokenInvalid,
    TokenMismatch,
    TokenUsed,
    Unauthorized,
    UnexpectedReply,
)
from token_service.client.advanced import Consumed, Started
from token_service.errors import ERRORS_BY_CODE, IssuancePaused

TOKEN = "t" * 43


def problem_response(
    status: int, code: str, headers: dict[str, str] | None = None, **extra: Any
) -> httpx.Response:
    body = {"type": f"https://token-service.dev/problems/{code}", "title": code, "status": status}
    body.update({"detail": f"detail of {code}", "code": code, **extra})
    return httpx.Response(
        status, json=body, headers={"Content-Type": "application/problem+json", **(headers or {})}
    )


def mock_client(handler: Any, retry: RetryPolicy = FAST_RETRY) -> TokenClient:
    return TokenClient("http://mock", API_KEY, retry=retry, transport=httpx.MockTransport(handler))


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("AbCdEfGhIjKlMnOpQr-_09", "AbCdEfGhIjKlMnOpQr-_09"),
        (None, None),
        ("short", None),
        ("AbCdEfGhIjKlMnOpQr-_0*", None),
        (22, None),
    ],
)
def test_the_problems_token_ref_is_kept_on_the_error(sent: Any, kept: str | None) -> None:
    extra = {} if sent is None else {"token_ref": sent}
    client = mock_client(lambda request: problem_response(409, "token_used", **extra))
    with pytest.raises(TokenError) as raised:
        client.consume(TOKEN, "pay")
    assert raised.value.code == "token_used"
    assert raised.value.token_ref == kept


@pytest.mark.parametrize("code", sorted(ERRORS_BY_CODE))
def test_every_problem_code_becomes_its_class(code: str) -> None:
    cls = ERRORS_BY_CODE[code]
    extra: dict[str, Any] = {}
    headers = {}
    if code in ("token_in_progress", "rate_limited", "store_unavailable", "issuance_paused"):
        headers["Retry-After"] = "7"
    if code == "token_failed":
        extra["error"] = {"reason": "declined"}
    if code == "token_mismatch":
        extra["field"] = "subject"
    if code == "invalid_request":
        extra["errors"] = {"scope": ["bad"]}
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return problem_response(cls.status, code, headers, **extra)

    # only issuing is rate limited or paused (openapi.yaml): each code from an operation answering it
    with mock_client(handler) as client:
        call = (
            (lambda: client.generate("scope"))
            if code in ("rate_limited", "issuance_paused")
            else (lambda: client.consume(TOKEN, "s"))
        )
        with pytest.raises(cls) as caught:
            call()
    error = caught.value
    assert type(error) is cls
    assert error.code == code
    assert error.detail == f"detail of {code}"
    if headers:
        assert error.retry_after_seconds == 7  # type: ignore[attr-defined]
    if code == "token_failed":
        assert isinstance(error, TokenFailed)
        assert error.error == {"reason": "declined"}
    if code == "token_mismatch":
        assert isinstance(error, TokenMismatch)
        assert error.field == "subject"
    if code == "invalid_request":
        assert isinstance(error, InvalidRequest)
        assert error.errors == {"scope": ["bad"]}
    # only an unavailable store is worth another attempt
    assert len(calls) == (FAST_RETRY.attempts if code == "store_unavailable" else 1)
    assert calls[0].headers["Authorization"] == f"Bearer {API_KEY}"


# One of each error, with what it adds to its problem document.
WRITTEN = [
    InvalidRequest("d", {"scope": ["bad"]}),
    Unauthorized("d"),
    TokenMismatch("d", field="subject"),
    TokenInvalid("d"),
    TokenUsed("d"),
    TokenInProgress("d", retry_after_seconds=7),
    TokenFailed("d", error={"reason": "declined"}),
    LeaseLost("d"),
    PayloadTooLarge("d"),
    RateLimited("d", retry_after_seconds=9),
    ServiceUnavailable("d", retry_after_seconds=3),
    IssuancePaused("d", retry_after_seconds=5),
]


def test_every_error_code_has_a_written_example() -> None:
    assert sorted(error.code for error in WRITTEN) == sorted(ERRORS_BY_CODE)


@pytest.mark.parametrize("error", WRITTEN, ids=lambda error: error.code)
def test_a_problem_document_reads_back_as_the_error_that_wrote_it(error: TokenError) -> None:
    # the service writes it (problems.problem_for), the SDK's HTTP transport reads it
    from token_service.client._replies import problem_error
    from token_service.problems import problem_for

    _status, headers, body = problem_for(error)
    back = problem_error(httpx.Headers(headers), json.loads(body))
    assert type(back) is type(error)
    assert back.detail == error.detail
    assert back.problem_extras() == error.problem_extras()


def test_a_proxys_page_is_unavailable_and_a_500_is_not_the_services_answer() -> None:
    answers = iter([httpx.Response(502, text="bad gateway"), httpx.Response(500, text="oops")])
    with mock_client(lambda request: next(answers), RetryPolicy(attempts=1)) as client:
        with pytest.raises(ServiceUnavailable):
            client.verify(TOKEN)
        with pytest.raises(UnexpectedReply, match="HTTP 500"):
            client.verify(TOKEN)


def test_transport_failures_are_retried_with_the_same_request_id() -> None:
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        if len(seen) == 1:
            raise httpx.ConnectError("refused", request=request)
        if len(seen) == 2:
            raise httpx.ReadTimeout("no reply", request=request)
        if len(seen) == 3:
            return problem_response(503, "store_unavailable", {"Retry-After": "1"})
        return httpx.Response(200, json={"outcome": "consumed", "replayed": True})

    with mock_client(handler, RetryPolicy(attempts=4, backoff_seconds=0.001)) as client:
        assert client.consume(TOKEN, "scope") == Consumed(replayed=True)
    assert len(seen) == 4
    assert len({attempt["request_id"] for attempt in seen}) == 1
    assert len(seen[0]["request_id"]) >= 16


def test_begin_retries_keep_the_request_id_given_by_the_caller() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content)["request_id"])
        if len(seen) == 1:
            raise httpx.RemoteProtocolError("server disconnected", request=request)
        return httpx.Response(
            200,
            json={
                "outcome": "started",
                "lease_id": "L",
                "lease_expires_at": "2030-01-01T00:00:00Z",
                "replayed": True,
            },
        )

    with mock_client(handler) as client:
        started = client.begin(TOKEN, "scope", request_id="mine")
    assert isinstance(started, Started)
    assert started.lease_id == "L"
    assert started.replayed
    assert seen == ["mine", "mine"]


def test_retries_give_up_with_service_unavailable() -> None:
    attempts = []

    def handler(request: httpx.Request) -> httpx.Response:
        attempts.append(1)
        raise httpx.ConnectError("refused", request=request)

    client = mock_client(handler, RetryPolicy(attempts=3, backoff_seconds=0.001))
    with client, pytest.raises(ServiceUnavailable) as caught:
        client.generate("scope")
    assert len(attempts) == 3
    assert isinstance(caught.value.__cause__, httpx.ConnectError)


def test_a_revoke_whose_reply_was_lost_is_still_a_success() -> None:
    answers = iter(["lost", "gone"])

    def handler(request: httpx.Request) -> httpx.Response:
        if next(answers) == "lost":
            raise httpx.ReadTimeout("reply lost", request=request)
        return problem_response(404, "token_invalid")

    with mock_client(handler) as client:
        assert client.revoke(TOKEN) is None


async def test_the_async_revoke_reads_a_lost_reply_the_same_way() -> None:
    # both clients' revokes share one rule (_ClientBase.revoke): held here for the awaited one too
    answers = iter(["lost", "gone", "gone"])

    def handler(request: httpx.Request) -> httpx.Response:
        if next(answers) == "lost":
            raise httpx.ReadTimeout("reply lost", request=request)
        return problem_response(404, "token_invalid")

    transport = httpx.MockTransport(handler)
    async with AsyncTokenClient("http://mock", API_KEY, retry=FAST_RETRY, transport=transport) as client:
        assert await client.revoke(TOKEN) is None
        with pytest.raises(TokenInvalid):  # no reply was lost this time: there was no such token
            await client.revoke(TOKEN)


def test_a_revoke_of_a_token_that_never_was_is_token_invalid() -> None:
    client = mock_client(lambda request: problem_response(404, "token_invalid"))
    with client, pytest.raises(TokenInvalid):
        client.revoke(TOKEN)


def test_http_service_not_listening_is_unavailable() -> None:
    client = TokenClient(f"http://127.0.0.1:{free_port()}", API_KEY, timeout=1, retry=2)
    with client, pytest.raises(ServiceUnavailable):
        client.consume(TOKEN, "scope")


def test_direct_redis_not_listening_is_unavailable() -> None:
    client = TokenClient.from_redis(f"redis://127.0.0.1:{free_port()}/0", timeout=0.5, retry=2)
    with client, pytest.raises(ServiceUnavailable):
        client.generate("scope")


def test_wrong_service_key_is_unauthorized(fake_redis: Any) -> None:
    transport = httpx.WSGITransport(app=inproc_app(fake_redis))
    with TokenClient("http://ts", "wrong-key-0123456789", transport=transport) as client:
        token = client.generate("scope").token  # the frontend route needs no key
        with pytest.raises(Unauthorized):
            client.consume(token, "scope")


def test_an_oversized_body_is_payload_too_large(fake_redis: Any) -> None:
    transport = httpx.WSGITransport(app=inproc_app(fake_redis))
    with TokenClient("http://ts", API_KEY, transport=transport) as client:
        token = client.generate("scope").token
        started = client.begin(token, "scope")
        assert isinstance(started, Started)
        with pytest.raises(PayloadTooLarge):
            client.complete(token, started.lease_id, "x" * 100_000)


def test_rate_limited_carries_retry_after() -> None:
    client = mock_client(lambda request: problem_response(429, "rate_limited", {"Retry-After": "30"}))
    with client, pytest.raises(RateLimited) as caught:
        client.generate("scope")
    assert caught.value.retry_after_seconds == 30


def test_in_progress_retry_after_falls_back_to_the_body() -> None:
    answer = problem_response(409, "token_in_progress", retry_after_seconds=4)
    with mock_client(lambda request: answer) as client, pytest.raises(TokenInProgress) as caught:
        client.begin(TOKEN, "scope")
    assert caught.value.retry_after_seconds == 4


def test_the_sdk_imports_and_runs_without_flask() -> None:
    script = textwrap.dedent(
        """
        import sys
        for name in ("flask", "werkzeug", "marshmallow", "httpx"):
            sys.modules[name] = None  # any import of them now fails (httpx: only HTTP needs it)
        import fakeredis
        from token_service.client import TokenClient, AsyncTokenClient, TokenUsed
        from token_service.client import guard
        from token_service import problems
        client = TokenClient.from_redis(fakeredis.FakeRedis())
        token = client.generate("scope").token
        assert client.guard(token, "scope").run(lambda: {"ok": 1}) == {"ok": 1}
        try:
            TokenClient("http://service", "key")
        except ImportError:
            print("httpx only for HTTP")
        try:
            from token_service.client.flask import require_token
        except ImportError:
            print("flask-free")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["httpx", "only", "for", "HTTP", "flask-free"]


async def test_async_transport_failures_are_retried_with_the_same_request_id() -> None:
    from token_service.client import AsyncTokenClient

    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content)["request_id"])
        if len(seen) == 1:
            raise httpx.ReadTimeout("no reply", request=request)
        if len(seen) == 2:
            return problem_response(503, "store_unavailable")
        return httpx.Response(200, json={"outcome": "consumed", "replayed": True})

    client = AsyncTokenClient(
        "http://mock", API_KEY, retry=FAST_RETRY, transport=httpx.MockTransport(handler)
    )
    async with client:
        assert await client.consume(TOKEN, "scope") == Consumed(replayed=True)
    assert len(seen) == 3
    assert len(set(seen)) == 1


def test_a_client_needs_somewhere_to_go() -> None:
    with pytest.raises(ValueError, match="base_url"):
        TokenClient()


@pytest.mark.parametrize("header", [b"\xb2", "²".encode(), b"9" * 5000, b"Wed, 21 Oct 2026 07:28:00 GMT"])
def test_a_retry_after_header_that_is_not_a_small_number_leaves_the_documents(header: bytes) -> None:
    # "²" is a digit to str.isdigit() and an error to int(); 5000 digits are past int()'s limit:
    # either escaped as a ValueError, which a caller's `except TokenError` let through as a 500
    from token_service.client._replies import problem_error

    headers = httpx.Headers([(b"Retry-After", header)])
    document = {"code": "token_in_progress", "detail": "busy", "retry_after_seconds": 2}
    error = problem_error(headers, document)
    assert isinstance(error, TokenInProgress)
    assert error.retry_after_seconds == 2
