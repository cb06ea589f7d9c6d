"""``@require_token``: a body that breaks before or while it goes out frees its token (the rule of
``client/_require_token_core.py``: a stream that raises is freed for a retry), never leaves it held
(the retry answered 409 ``token_in_progress`` until the lease ran out). On a real redis-server.

- Django, from a sync view and an ``async def`` view alike: an async view's synchronous stream is read
  ahead before it goes out (``django._read_ahead``), and a break there must free the token too.
- Django, an ``async def`` view's async stream served over WSGI (gunicorn's sync workers, the test
  ``Client``): Django reads it whole after the view's event loop is gone, on a loop of its own, where
  the guard's Redis connection cannot be used ("Event loop is closed": the body broke, the token stayed
  held until its lease ran out, then a retry ran the view again). It is read in the view's loop
  instead, as Django would read it, so it is kept (or omitted with its length) and goes out whole.
- FastAPI: a ``FileResponse`` whose file is missing (its size is read to settle it; Flask's
  ``send_file`` raises in the view) answers 500 and frees the token."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio
from django.http import HttpRequest, StreamingHttpResponse
from django.test import AsyncClient as DjangoAsyncClient
from django.test import Client as DjangoClient
from django.test import override_settings
from django.urls import path
from fastapi import FastAPI
from fastapi.responses import FileResponse

from tests.integrations.test_require_token_parity import configure_django
from tests.support.processes import RedisServer
from token_service.client import AsyncTokenClient, TokenClient
from token_service.client.django import require_token
from token_service.client.fastapi import require_token as fastapi_require_token

pytestmark = pytest.mark.real
SCOPE = "report.stream"

urlpatterns: list[Any] = []  # this module is the Django URLconf; the test fills it in


def breaks(runs: Counter[str]) -> StreamingHttpResponse:
    runs["view"] += 1

    def chunks() -> Iterator[bytes]:
        yield b"first line\n"
        raise OSError("the report's source went away")

    return StreamingHttpResponse(chunks(), content_type="text/plain")


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_stream_that_breaks_frees_the_token(
    kind: str, redis_server: RedisServer, real_redis: redis.Redis
) -> None:
    configure_django()
    runs: Counter[str] = Counter()
    connection = redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port)
    async_tokens = AsyncTokenClient.from_redis(connection)
    with TokenClient.from_redis(real_redis) as tokens:
        if kind == "sync":

            def sync_view(request: HttpRequest) -> StreamingHttpResponse:
                return breaks(runs)

            urlpatterns[:] = [path("report", require_token(SCOPE, client=tokens)(sync_view))]
        else:

            async def async_view(request: HttpRequest) -> StreamingHttpResponse:
                return breaks(runs)

            urlpatterns[:] = [path("report", require_token(SCOPE, client=async_tokens)(async_view))]
        token = tokens.generate(SCOPE).token
        try:
            with override_settings(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["testserver"]):
                for attempt in (1, 2):
                    if kind == "sync":
                        answer = DjangoClient(raise_request_exception=False).post(
                            "/report", headers={"Idempotency-Token": token}
                        )
                        with pytest.raises(OSError, match="went away"):
                            answer.getvalue()  # the body breaks on its way out
                    else:
                        answer = await DjangoAsyncClient(raise_request_exception=False).post(
                            "/report", headers={"Idempotency-Token": token}
                        )
                        assert answer.status_code == 500  # broke before it went out
                    answer.close()
                    # freed for the retry: the retry runs the view again, never 409 in progress
                    assert tokens.inspect(token).state == "ISSUED", attempt
                    assert runs["view"] == attempt
        finally:
            await async_tokens.close()
            await connection.aclose()


@pytest.mark.parametrize("count", [3, 300])  # under and over the caps
def test_an_async_views_async_stream_over_wsgi_is_settled(
    redis_server: RedisServer, real_redis: redis.Redis, count: int
) -> None:
    configure_django()
    runs: Counter[str] = Counter()
    body = b"".join(b"line %04d\n" % number for number in range(count))

    async def streams(request: HttpRequest) -> StreamingHttpResponse:
        runs["view"] += 1

        async def chunks() -> AsyncIterator[bytes]:
            for number in range(count):
                yield b"line %04d\n" % number

        return StreamingHttpResponse(chunks(), content_type="text/plain")

    async def view(request: HttpRequest) -> Any:
        # under WSGI each request has an event loop of its own: a client per request, closed in it
        connection = redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port)
        client = AsyncTokenClient.from_redis(connection)
        try:
            return await require_token(SCOPE, client=client, max_result_bytes=2048)(streams)(request)
        finally:
            await client.close()
            await connection.aclose()

    urlpatterns[:] = [path("report", view)]
    with TokenClient.from_redis(real_redis) as tokens:
        token = tokens.generate(SCOPE).token
        headers = {"Idempotency-Token": token}
        with override_settings(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["testserver"]):
            first = DjangoClient(raise_request_exception=False).post("/report", headers=headers)
            assert first.status_code == 200
            assert b"".join(first) == body
            first.close()
            assert tokens.inspect(token).state == "SUCCEEDED"
            again = DjangoClient().post("/report", headers=headers)
        assert again["Idempotent-Replayed"] == "true"
        if count == 3:
            assert again.content == body
        else:
            assert (again.content, again["Idempotent-Body-Omitted"]) == (b"", str(len(body)))
        assert runs["view"] == 1


def test_an_async_views_async_stream_that_breaks_over_wsgi_frees_the_token(
    redis_server: RedisServer, real_redis: redis.Redis
) -> None:
    configure_django()
    runs: Counter[str] = Counter()

    async def streams(request: HttpRequest) -> StreamingHttpResponse:
        runs["view"] += 1

        async def chunks() -> AsyncIterator[bytes]:
            yield b"first line\n"
            raise OSError("the report's source went away")

        return StreamingHttpResponse(chunks(), content_type="text/plain")

    async def view(request: HttpRequest) -> Any:
        connection = redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port)
        client = AsyncTokenClient.from_redis(connection)
        try:
            return await require_token(SCOPE, client=client)(streams)(request)
        finally:
            await client.close()
            await connection.aclose()

    urlpatterns[:] = [path("report", view)]
    with TokenClient.from_redis(real_redis) as tokens:
        token = tokens.generate(SCOPE).token
        with override_settings(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["testserver"]):
            for attempt in (1, 2):
                answer = DjangoClient(raise_request_exception=False).post(
                    "/report", headers={"Idempotency-Token": token}
                )
                assert answer.status_code == 500  # broke before it went out
                answer.close()
                assert tokens.inspect(token).state == "ISSUED", attempt
                assert runs["view"] == attempt


async def test_a_file_response_whose_file_is_missing_frees_the_token(
    redis_server: RedisServer, real_redis: redis.Redis, tmp_path: Path
) -> None:
    runs: Counter[str] = Counter()
    connection = redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port)
    async_tokens = AsyncTokenClient.from_redis(connection)
    app = FastAPI()

    @app.post("/report")
    @fastapi_require_token(async_tokens, SCOPE)
    async def report() -> FileResponse:
        runs["view"] += 1
        return FileResponse(tmp_path / "not-written.pdf", media_type="application/pdf")

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    with TokenClient.from_redis(real_redis) as tokens:
        token = tokens.generate(SCOPE).token
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                for attempt in (1, 2):
                    answer = await client.post("/report", headers={"Idempotency-Token": token})
                    assert answer.status_code == 500, answer.text
                    assert tokens.inspect(token).state == "ISSUED", attempt
                    assert runs["view"] == attempt
        finally:
            await async_tokens.close()
            await connection.aclose()
