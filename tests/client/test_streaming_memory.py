"""A 64 MB streamed response through the middlewares: passed through, never buffered past the cap.

Measured with tracemalloc around the whole request (the app's own chunks
included), on a real redis-server: the peak stays under twice the storage cap,
also for a body just under the cap, which is kept. (tracemalloc sees Python's
heap: hiredis's own C buffer when it packs the command is not in it.
tests/client/test_response_kinds_gunicorn.py measures a worker's resident set.)
"""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from werkzeug.test import EnvironBuilder

from tests.support.processes import RedisServer
from token_service.client import asgi
from token_service.client.wsgi import IdempotencyMiddleware

pytestmark = [pytest.mark.real, pytest.mark.slow]

CHUNK = 64 * 1024
CHUNKS = 1024  # 64 MB
CAP = 1024 * 1024
HEADERS = {"Idempotency-Key": '"big-report"', "Authorization": "Bearer alice"}


def measured_peak() -> int:
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def test_a_64_mb_wsgi_stream_peaks_under_twice_the_cap(real_redis: redis.Redis) -> None:
    def report(environ: Any, start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        for _ in range(CHUNKS):
            yield b"x" * CHUNK

    middleware = IdempotencyMiddleware(report, real_redis, max_stored_bytes=CAP)
    sent: list[str] = []

    def run() -> int:
        environ = EnvironBuilder(method="POST", headers=HEADERS, json={"month": 11}).get_environ()
        body = middleware(environ, lambda status, headers, exc_info=None: sent.append(status))
        received = sum(len(chunk) for chunk in body)
        body.close()  # type: ignore[attr-defined]
        return received

    tracemalloc.start()
    received = run()
    peak = measured_peak()
    assert received == CHUNK * CHUNKS
    assert peak < 2 * CAP, f"peak {peak} bytes over a cap of {CAP}"
    # the duplicate gets status and headers, the body marked omitted
    replay_headers: list[Any] = []
    environ = EnvironBuilder(method="POST", headers=HEADERS, json={"month": 11}).get_environ()
    replay = b"".join(
        middleware(environ, lambda status, headers, exc_info=None: replay_headers.extend(headers))
    )
    assert replay == b""
    assert ("Idempotent-Body-Omitted", str(CHUNK * CHUNKS)) in replay_headers


def test_a_body_just_under_the_cap_is_stored_with_its_peak_under_twice_the_cap(
    real_redis: redis.Redis,
) -> None:
    """The worst case of the bound: a body that is kept is held once, then sent to Redis (a second copy:
    redis-py's packed command); its pieces, the head joined to it, are not held beside those two."""
    chunks = CAP // CHUNK - 2  # kept: all but two chunks' worth of the cap

    def report(environ: Any, start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        for _ in range(chunks):
            yield b"x" * CHUNK

    middleware = IdempotencyMiddleware(report, real_redis, max_stored_bytes=CAP)
    environ = EnvironBuilder(method="POST", headers=HEADERS, json={"month": 11}).get_environ()
    tracemalloc.start()
    body = middleware(environ, lambda status, headers, exc_info=None: None)
    received = sum(len(chunk) for chunk in body)
    body.close()  # type: ignore[attr-defined]
    peak = measured_peak()
    assert received == CHUNK * chunks
    assert peak < 2 * CAP, f"peak {peak} bytes, {peak / received:.2f}x the body, cap {CAP}"
    environ = EnvironBuilder(method="POST", headers=HEADERS, json={"month": 11}).get_environ()
    replay = b"".join(middleware(environ, lambda status, headers, exc_info=None: None))
    assert replay == b"x" * received  # kept whole: a duplicate gets it


async def test_a_64_mb_asgi_stream_peaks_under_twice_the_cap(redis_server: RedisServer) -> None:
    async def report(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        for _ in range(CHUNKS):
            await send({"type": "http.response.body", "body": b"x" * CHUNK, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    client = redis.asyncio.Redis.from_url(redis_server.url)
    await client.flushall()
    middleware = asgi.IdempotencyMiddleware(report, client, max_stored_bytes=CAP)
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/reports",
        "query_string": b"",
        "headers": [(b"idempotency-key", b'"big-report"'), (b"authorization", b"Bearer alice")],
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    received = 0
    replay_headers: list[Any] = []

    async def send(message: dict[str, Any]) -> None:
        nonlocal received
        received += len(message.get("body", b""))
        replay_headers.extend(message.get("headers", []))

    try:
        tracemalloc.start()
        await middleware(scope, receive, send)
        peak = measured_peak()
        assert received == CHUNK * CHUNKS
        assert peak < 2 * CAP, f"peak {peak} bytes over a cap of {CAP}"
        received = 0
        await middleware(scope, receive, send)
        assert received == 0
        assert (b"idempotent-body-omitted", str(CHUNK * CHUNKS).encode()) in replay_headers
    finally:
        await client.flushall()
        await client.aclose()


def test_the_asgi_middleware_imports_without_any_web_framework() -> None:
    blocked = (
        "import sys\nfor name in ('starlette', 'fastapi', 'django', 'flask'): sys.modules[name] = None\n"
    )
    code = blocked + "import token_service.client.asgi as m; print(m.IdempotencyMiddleware.__name__)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "IdempotencyMiddleware"
