"""The JS helper's contract, run in headless Chromium against the real token service.

The backend the helper talks to is scripted with Playwright routing (503s,
409s, 429s, dropped connections), so each rule is checked on its own: the
same token across the helper's own retries, a fresh token per action, and
clear errors for 409 and 429.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.browser import RunningDemo

pytestmark = pytest.mark.slow

BACKEND = "/mock/charge"


@pytest.fixture
def page(context: Any, demo: RunningDemo) -> Iterator[Any]:
    page = context.new_page()
    page.goto(demo.token_url + "/healthz")  # any page of the token service's origin
    yield page
    page.close()


Reply = Callable[[Any], None]


def script_backend(page: Any, replies: list[Reply]) -> list[dict[str, str]]:
    """Answer the backend's requests with ``replies`` in order; returns the requests' headers."""
    seen: list[dict[str, str]] = []

    def handle(route: Any) -> None:
        seen.append(route.request.headers)
        replies[min(len(seen), len(replies)) - 1](route)

    page.route("**" + BACKEND, handle)
    return seen


def answer(status: int, body: Any = None, headers: dict[str, str] | None = None) -> Reply:
    content_type = "application/problem+json" if status >= 400 else "application/json"
    return lambda route: route.fulfill(
        status=status,
        body=json.dumps(body if body is not None else {"ok": True}),
        headers={"Content-Type": content_type, **(headers or {})},
    )


def drop(route: Any) -> None:
    route.abort("connectionreset")


def run(page: Any, body: str) -> Any:
    """Run ``body`` (an async function body) with the module as ``m`` and a fast client as ``client``."""
    return page.evaluate(
        "async (backend) => {"
        "  const m = await import('/static/token-client.js');"
        "  const client = new m.TokenClient({ retryDelayMs: 5 });"
        "  const post = { method: 'POST', headers: {'Content-Type': 'application/json'}, body: '{}' };"
        f"  {body}"
        "}",
        BACKEND,
    )


def test_get_token_issues_a_token_for_the_scope(page: Any) -> None:
    issued = run(page, "return await m.getToken('payment.create', { subject: 'u1', ttlSeconds: 60 });")
    assert issued["scope"] == "payment.create"
    assert issued["subject"] == "u1"
    assert issued["ttl_seconds"] == 60
    assert len(issued["token"]) >= 22


def test_retries_keep_the_token_and_a_new_action_gets_a_fresh_one(page: Any, demo: RunningDemo) -> None:
    seen = script_backend(page, [drop, answer(503, {"code": "store_unavailable"}, {"Retry-After": "0"}),
                                 answer(201), answer(201)])  # fmt: skip
    result = run(
        page,
        """
        const action = client.action('payment.create');
        const response = await action.fetch(backend, post);
        const again = await client.action('payment.create').fetch(backend, post);
        return { status: response.status, attempts: action.attempts, again: again.status };
        """,
    )
    assert result == {"status": 201, "attempts": 3, "again": 201}
    tokens = [headers["idempotency-token"] for headers in seen]
    assert len(tokens) == 4
    assert tokens[0] == tokens[1] == tokens[2]  # a dropped connection, a 503, then success
    assert tokens[3] != tokens[0]  # the new action
    assert len(demo.token_requests.where("POST", "/token/generate")) == 2


def test_a_double_submit_shares_one_token(page: Any, demo: RunningDemo) -> None:
    seen = script_backend(page, [answer(201)])
    run(
        page,
        "const a = client.action('payment.create');"
        "await Promise.all([a.fetch(backend, post), a.fetch(backend, post)]);",
    )
    assert len(seen) == 2
    assert seen[0]["idempotency-token"] == seen[1]["idempotency-token"]
    assert len(demo.token_requests.where("POST", "/token/generate")) == 1


def test_in_progress_is_waited_out_and_the_replay_is_recognised(page: Any) -> None:
    in_progress = {"code": "token_in_progress", "retry_after_seconds": 30}
    seen = script_backend(page, [answer(409, in_progress, {"Retry-After": "30"}),
                                 answer(201, {"id": 1}, {"Idempotent-Replayed": "true"})])  # fmt: skip
    result = run(
        page,
        """
        const reasons = [];
        const onRetry = (x) => reasons.push(x);
        const r = await client.action('payment.create').fetch(backend, post, { onRetry });
        return { replayed: m.isReplayed(r), body: await r.json(), reasons };
        """,
    )
    assert result["replayed"] is True
    assert result["body"] == {"id": 1}
    assert len(seen) == 2
    [retry] = result["reasons"]
    assert retry["reason"] == "in_progress"
    assert retry["delayMs"] < 1000  # polled, not the lease's whole Retry-After


def test_waiting_for_another_request_of_the_action_is_bounded(page: Any) -> None:
    in_progress = {"code": "token_in_progress", "retry_after_seconds": 30}
    seen = script_backend(page, [answer(409, in_progress, {"Retry-After": "30"})])
    error = run(
        page,
        """
        const patient = new m.TokenClient({ retryDelayMs: 20, inProgressWaitMs: 100 });
        try { await patient.action('payment.create').fetch(backend, post); return null; }
        catch (e) { return { duplicate: e instanceof m.DuplicateRequestError, code: e.code,
                             after: e.retryAfterSeconds }; }
        """,
    )
    assert error == {"duplicate": True, "code": "token_in_progress", "after": 30}
    assert 2 <= len(seen) <= 6  # polled a few times, not 30 s, and gave up


def test_409_surfaces_as_a_duplicate_error_with_the_problem(page: Any) -> None:
    failed = {"code": "token_failed", "status": 409, "detail": "declined", "error": {"reason": "card"}}
    script_backend(page, [answer(409, failed)])
    error = run(
        page,
        """
        try { await client.action('payment.create').fetch(backend, post); return null; }
        catch (e) { return { duplicate: e instanceof m.DuplicateRequestError, name: e.name, status: e.status,
                             code: e.code, stored: e.problem.error, body: await e.response.json() }; }
        """,
    )
    assert error == {
        "duplicate": True,
        "name": "DuplicateRequestError",
        "status": 409,
        "code": "token_failed",
        "stored": {"reason": "card"},
        "body": failed,
    }


def test_429_surfaces_retry_after_even_when_the_header_is_not_exposed(page: Any) -> None:
    # Cross-origin, Retry-After is hidden unless exposed: the body's retry_after_seconds counts.
    script_backend(page, [answer(429, {"code": "rate_limited", "retry_after_seconds": 7})])
    error = run(
        page,
        """
        try { await client.action('payment.create').fetch(backend, post); return null; }
        catch (e) {
          return { limited: e instanceof m.RateLimitedError, code: e.code, after: e.retryAfterSeconds };
        }
        """,
    )
    assert error == {"limited": True, "code": "rate_limited", "after": 7}


def test_token_service_refusals_are_typed_errors(page: Any) -> None:
    page.route(
        "**/token/generate",
        answer(429, {"code": "rate_limited", "retry_after_seconds": 3}, {"Retry-After": "3"}),
    )
    limited = run(
        page,
        """
        try { await client.getToken('payment.create'); return null; }
        catch (e) { return { limited: e instanceof m.RateLimitedError, after: e.retryAfterSeconds }; }
        """,
    )
    assert limited == {"limited": True, "after": 3}
    page.unroute("**/token/generate")
    invalid = run(
        page,
        """
        try { await client.getToken('not a scope!'); return null; }
        catch (e) { return { base: e instanceof m.TokenClientError, status: e.status, code: e.code,
                             fields: Object.keys(e.problem.errors) }; }
        """,
    )
    assert invalid == {"base": True, "status": 400, "code": "invalid_request", "fields": ["scope"]}


def test_network_errors_give_up_after_the_retries(page: Any) -> None:
    seen = script_backend(page, [drop])
    error = run(
        page,
        """
        try { await new m.TokenClient({ retries: 2, retryDelayMs: 1 }).action('s').fetch(backend, post); }
        catch (e) { return { network: e instanceof m.NetworkError, cause: String(e.cause) }; }
        """,
    )
    assert error["network"] is True
    assert "TypeError" in error["cause"]
    assert len(seen) == 3
    assert len({headers["idempotency-token"] for headers in seen}) == 1


def test_a_script_tag_sets_window_token_client(page: Any, demo: RunningDemo) -> None:
    assert page.evaluate("typeof window.TokenClient") == "undefined"
    page.add_script_tag(url=demo.token_url + "/static/token-client.js", type="module")
    page.wait_for_function("typeof window.TokenClient === 'function'")
    names = page.evaluate(
        "['getToken', 'idempotentFetch', 'isReplayed', 'DuplicateRequestError', 'RateLimitedError']"
        ".filter((name) => name in window.TokenClient)"
    )
    assert names == ["getToken", "idempotentFetch", "isReplayed", "DuplicateRequestError", "RateLimitedError"]
