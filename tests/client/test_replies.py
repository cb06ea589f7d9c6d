"""The HTTP transport reads only what the contract allows, from a "service" that lies.

Each reply below came from a hand-written server (tests/support/lying_server.py) and was
once taken for a consume (a 302, an HTML 200, a 202 after a 100, ``"replayed": "false"``
read as True) or escaped as a raw JSONDecodeError, KeyError or TypeError past every
``except TokenError``. Now each is one UnexpectedReply, sync and async, that says the
endpoint is not a token service and never repeats the token; a proxy's 502/503/504 page
is an unavailable service, retried with the same request id; a 400 MB body is never read.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.lying_server import LyingServer, canned, flood, head, json_reply
from tests.support.processes import REPO_ROOT
from token_service.client import (
    AsyncTokenClient,
    RetryPolicy,
    ServiceUnavailable,
    TokenClient,
    TokenError,
    UnexpectedReply,
)
from token_service.client._replies import OPERATIONS, cap_bytes
from token_service.client.advanced import Consumed

TOKEN = "tok-" + "s3cr3t" * 7  # must never appear in an error's message
SCOPE = "payment.create"
CONSUMED = {"outcome": "consumed", "replayed": False}
RETRY = RetryPolicy(attempts=3, backoff_seconds=0.01, max_backoff_seconds=0.02)


def consume(kind: str, url: str, **options: Any) -> Consumed:
    """One consume over HTTP with the sync or the async client."""
    options = {"retry": RETRY, "timeout": 10, **options}
    if kind == "sync":
        with TokenClient(url, "key", **options) as client:
            return client.consume(TOKEN, SCOPE, request_id="req-1")

    async def run() -> Consumed:
        async with AsyncTokenClient(url, "key", **options) as client:
            return await client.consume(TOKEN, SCOPE, request_id="req-1")

    return asyncio.run(run())


html = {"Content-Type": "text/html; charset=utf-8"}
LIES: dict[str, bytes] = {
    "302 with a consume's JSON": head(
        "302 Found",
        {"Content-Type": "application/json", "Location": "/elsewhere"},
        json.dumps(CONSUMED).encode(),
    ),
    "307 without a body": head("307 Temporary Redirect", {"Location": "https://token-service.example/"}),
    "200 text/html holding replayed": head("200 OK", html, b'{"replayed":false}'),
    "200 HTML page": head("200 OK", html, b"<html><body>Welcome to nginx!</body></html>"),
    "202 after a 100": b"HTTP/1.1 100 Continue\r\n\r\n" + json_reply("202 Accepted", CONSUMED),
    "204": head("204 No Content", {"Content-Length": "0"}),
    "invalid JSON": head("200 OK", {"Content-Type": "application/json"}, b'{"outcome": "consumed",'),
    "{}": json_reply("200 OK", {}),
    "a list": json_reply("200 OK", [CONSUMED]),
    '"replayed": "false"': json_reply("200 OK", {"outcome": "consumed", "replayed": "false"}),
    "replayed 0": json_reply("200 OK", {"outcome": "consumed", "replayed": 0}),
    "another outcome": json_reply("200 OK", {"outcome": "started", "replayed": False}),
    "gzip the SDK did not ask for": head(
        "200 OK",
        {"Content-Type": "application/json", "Content-Encoding": "gzip"},
        gzip.compress(json.dumps(CONSUMED).encode()),
    ),
    "a 500 page": head("500 Internal Server Error", html, b"<html>Internal Server Error</html>"),
    "405 of another server": head("405 Method Not Allowed", {"Allow": "GET"}),
    "404 of a wrong path": json_reply(
        "404 Not Found", {"code": "not_found", "detail": "nothing here"}, "application/problem+json"
    ),
    "409 as JSON, not a problem": json_reply("409 Conflict", {"code": "token_used"}),
    "403 with a code of another status": json_reply(
        "403 Forbidden", {"code": "token_used", "detail": "x"}, "application/problem+json"
    ),
    "problem that is a list": json_reply("404 Not Found", ["token_invalid"], "application/problem+json"),
    "NaN": head("200 OK", {"Content-Type": "application/json"}, b'{"outcome":"consumed","replayed":NaN}'),
    "not UTF-8": head("200 OK", {"Content-Type": "application/json"}, b'{"outcome":"consum\xe9d"}'),
    "nested past Python's recursion": head("200 OK", {"Content-Type": "application/json"}, b"[" * 30000),
}


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("lie", sorted(LIES))
def test_a_reply_the_api_never_sends_is_unexpected_and_not_retried(kind: str, lie: str) -> None:
    with LyingServer(canned(LIES[lie])) as server, pytest.raises(TokenError) as raised:
        consume(kind, server.url)
    error = raised.value
    assert type(error) is UnexpectedReply, f"{type(error).__name__}: {error}"
    message = str(error)
    assert f"{server.url}/token/consume did not answer as a token service" in message
    assert TOKEN not in message
    assert TOKEN not in repr(error.args)
    assert error.reason
    assert error.reason in message
    assert error.reply_status is not None
    assert str(error.reply_status) in message
    # the same request to the same endpoint would get the same answer: asked once
    assert len(server.requests) == 1


def test_each_lie_says_what_was_wrong() -> None:
    said = {}
    for lie in ('"replayed": "false"', "307 without a body", "200 HTML page", "{}"):
        with LyingServer(canned(LIES[lie])) as server, pytest.raises(UnexpectedReply) as raised:
            consume("sync", server.url)
        said[lie] = (raised.value.reply_status, raised.value.media_type, raised.value.reason)
    assert said == {
        '"replayed": "false"': (200, "application/json", "its replayed is not true or false"),
        "307 without a body": (
            307,
            None,
            "307 is not a status /token/consume answers with "
            "(200, 400, 401, 403, 404, 405, 408, 409, 413, 414, 417, 431, 500, 501, 503)",
        ),
        "200 HTML page": (200, "text/html", "/token/consume answers a 200 as application/json"),
        "{}": (200, "application/json", "its outcome is not 'consumed'"),
    }


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize(
    "page",
    [
        head("502 Bad Gateway", html, b"<html><h1>502 Bad Gateway</h1></html>"),
        head("503 Service Unavailable", {"Content-Type": "text/plain", "Retry-After": "1"}, b"down"),
        head("504 Gateway Timeout", html, b"<html>504</html>"),
        head("408 Request Timeout", html, b"<html>slow</html>"),
        json_reply("503 Service Unavailable", {"code": "store_unavailable"}, "application/problem+json"),
        head("502 Bad Gateway", {"Content-Type": "application/problem+json"}, b"{not json"),
        json_reply("500 Internal Server Error", {"code": "internal_error"}, "application/problem+json"),
    ],
    ids=["502 html", "503 text", "504 html", "408 html", "503 problem", "502 broken problem", "500 problem"],
)
def test_a_proxys_page_is_an_unavailable_service_retried_with_the_same_request_id(
    kind: str, page: bytes
) -> None:
    answers = iter([canned(page), canned(json_reply("200 OK", {"outcome": "consumed", "replayed": True}))])

    def answer(conn: Any) -> None:
        next(answers)(conn)

    with LyingServer(answer) as server:
        assert consume(kind, server.url) == Consumed(replayed=True)
    assert [request["request_id"] for request in server.requests] == ["req-1", "req-1"]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_unavailable_page_every_time_is_service_unavailable(kind: str) -> None:
    page = head("502 Bad Gateway", html, b"<html>502</html>")
    with LyingServer(canned(page)) as server, pytest.raises(ServiceUnavailable, match="HTTP 502"):
        consume(kind, server.url)
    assert len(server.requests) == RETRY.attempts


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_400_mb_reply_is_never_read_past_the_cap(kind: str, chunked: bool) -> None:
    flooding = LyingServer(flood(400 * 1024 * 1024, chunked=chunked))
    with flooding as server, pytest.raises(UnexpectedReply, match="the SDK reads") as raised:
        consume(kind, server.url)
    assert raised.value.reply_status == 200
    assert str(cap_bytes()) in raised.value.reason
    assert len(server.requests) == 1


FLOODED = textwrap.dedent(
    """
    import asyncio, resource, sys
    from token_service.client import AsyncTokenClient, TokenClient, TokenError

    url, kind = sys.argv[1], sys.argv[2]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        if kind == "sync":
            with TokenClient(url, "key", retry=1, timeout=60) as client:
                print(client.consume("t" * 43, "pay"), file=sys.stderr)
        else:
            async def run():
                async with AsyncTokenClient(url, "key", retry=1, timeout=60) as client:
                    return await client.consume("t" * 43, "pay")
            print(asyncio.run(run()), file=sys.stderr)
    except TokenError as error:
        print(type(error).__name__, file=sys.stderr)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(after - before)  # KiB on Linux
    """
)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_400_mb_chunked_reply_leaves_the_callers_memory_as_it_was(kind: str) -> None:
    """Peak RSS of a process whose one consume got a 400 MB chunked 200 (no Content-Length):
    on the old code it grew by about 1.2 GB and returned Consumed."""
    with LyingServer(flood(400 * 1024 * 1024, chunked=True)) as server:
        done = subprocess.run(
            [sys.executable, "-c", FLOODED, server.url, kind],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    grown_kib = int(done.stdout.strip())
    print(f"\n{kind}: peak RSS grew by {grown_kib / 1024:.1f} MB reading a 400 MB reply")
    assert grown_kib < 64 * 1024, f"peak RSS grew by {grown_kib} KiB ({done.stderr.strip()})"
    assert done.stderr.split() == ["UnexpectedReply"], done.stderr


# -- the table the reading goes by is the contract's --------------------------------------------------

OPERATION_IDS = {
    "generate": "generateToken",
    "generate_batch": "generateTokens",
    "consume": "consumeToken",
    "begin": "beginOperation",
    "renew": "renewLease",
    "complete": "completeOperation",
    "fail": "failOperation",
    "inspect": "inspectToken",
    "revoke": "revokeToken",
}


def test_each_operations_statuses_are_those_openapi_yaml_documents() -> None:
    contract = yaml.safe_load(Path(REPO_ROOT, "openapi.yaml").read_text(encoding="utf-8"))
    documented = {
        operation["operationId"]: {int(status) for status in operation["responses"]}
        for item in contract["paths"].values()
        for operation in item.values()
        if isinstance(operation, dict) and "operationId" in operation
    }
    ours = {OPERATION_IDS[name]: {op.success, *op.errors} for name, op in OPERATIONS.items()}
    assert ours == {operation_id: documented[operation_id] for operation_id in ours}
    for name, op in OPERATIONS.items():
        path = contract["paths"][op.path]["post"]
        assert path["operationId"] == OPERATION_IDS[name]
        success = path["responses"][str(op.success)]
        assert list(success["content"]) == ["application/json"]


def test_the_cap_holds_the_largest_reply_the_service_sends() -> None:
    """A 1000-token batch with every field at its longest, and a begin replaying a stored result
    of the service's default maximum (16384 bytes of ASCII JSON), each fit their cap."""
    longest_token = {
        "token": "T" * 128,
        "scope": "s" * 64,
        "subject": "\U0001f600" * 128,
        "fingerprint": "\U0001f600" * 128,
        "ttl_seconds": 31_536_000,
        "expires_at": "2026-12-06T20:43:12.123456+00:00",
    }
    encoder = json.JSONEncoder(separators=(",", ":"))  # the service's own (server/responses.py)
    one = len(encoder.encode(longest_token))
    assert one == 3388  # the figure _replies.py sizes TOKEN_BYTES by
    assert len(encoder.encode({"tokens": [longest_token] * 1000})) <= cap_bytes(count=1000)
    result = "x" * (16384 - 2)  # a JSON string of exactly 16384 bytes
    begin = {"outcome": "succeeded", "replayed": True, "result": result}
    assert len(encoder.encode(begin)) <= cap_bytes()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_reply_with_members_the_sdk_does_not_know_still_reads(kind: str) -> None:
    # (every operation's real replies: test_client and test_async_client, against the app)
    replies = [
        json_reply("200 OK", {"outcome": "consumed", "replayed": False}),
        json_reply("200 OK", {"outcome": "consumed", "replayed": True, "added_later": 1}),
    ]
    for reply in replies:
        with LyingServer(canned(reply)) as server:
            assert isinstance(consume(kind, server.url), Consumed)
