"""SDK fixtures: a TokenClient / AsyncTokenClient over every transport.

``sdk`` is parametrized over four ways to reach the same Lua scripts:

- ``direct-fake``   — ``TokenClient.from_redis`` on fakeredis
- ``direct-real``   — ``TokenClient.from_redis`` on a real redis-server
- ``http-inproc``   — HTTP to the Flask app in-process (httpx's WSGI transport), fakeredis
- ``http-gunicorn`` — HTTP to the service under gunicorn, on a real redis-server

``async_sdk`` is the same for ``AsyncTokenClient``. Each yields an
:class:`tests.support.sdk.Sdk` with the client and a raw (sync) Redis connection to the same data.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import fakeredis
import httpx
import pytest
import redis.asyncio

from tests.support.processes import Gunicorn, RedisServer
from tests.support.sdk import Sdk, inproc_app
from tests.support.service import API_KEY, FAST_RETRY, service_env
from token_service.client import AsyncTokenClient, TokenClient

TRANSPORTS = [
    pytest.param("direct-fake", marks=pytest.mark.fake),
    pytest.param("direct-real", marks=pytest.mark.real),
    pytest.param("http-inproc", marks=pytest.mark.fake),
    # slow: the first test on a worker starts gunicorn (~13 s at load); make check leaves it out
    pytest.param("http-gunicorn", marks=[pytest.mark.real, pytest.mark.slow]),
]


class AsyncWSGITransport(httpx.AsyncBaseTransport):
    """httpx has no async WSGI transport: run the sync one in a thread."""

    def __init__(self, app: Any) -> None:
        self._sync = httpx.WSGITransport(app=app)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        sync_request = httpx.Request(request.method, request.url, headers=request.headers, content=body)
        response = await asyncio.to_thread(self._sync.handle_request, sync_request)
        content = await asyncio.to_thread(response.read)
        return httpx.Response(response.status_code, headers=response.headers, content=content)


@pytest.fixture(scope="session")
def gunicorn(redis_server: RedisServer) -> Iterator[Gunicorn]:
    server = Gunicorn(service_env(redis_server.url), workers=2).start()
    yield server
    server.stop()


@pytest.fixture
def fake_redis() -> Iterator[Any]:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    yield client
    client.close()


@pytest.fixture(params=TRANSPORTS)
def sdk(request: pytest.FixtureRequest) -> Iterator[Sdk]:
    kind: str = request.param
    raw: Any = request.getfixturevalue("fake_redis" if kind.endswith(("fake", "inproc")) else "real_redis")
    if kind.startswith("direct"):
        client = TokenClient.from_redis(raw, retry=FAST_RETRY)
    elif kind == "http-inproc":
        transport = httpx.WSGITransport(app=inproc_app(raw))
        client = TokenClient("http://token-service", API_KEY, retry=FAST_RETRY, transport=transport)
    else:
        server: Gunicorn = request.getfixturevalue("gunicorn")
        client = TokenClient(server.url, API_KEY, retry=FAST_RETRY)
    with client:
        yield Sdk(kind, client, raw)


@pytest.fixture(params=TRANSPORTS)
async def async_sdk(request: pytest.FixtureRequest) -> AsyncIterator[Sdk]:
    kind: str = request.param
    async_redis: Any = None
    if kind == "direct-fake":
        server = fakeredis.FakeServer()
        raw: Any = fakeredis.FakeRedis(server=server)
        async_redis = fakeredis.FakeAsyncRedis(server=server)
        client = AsyncTokenClient.from_redis(async_redis, retry=FAST_RETRY)
    elif kind == "direct-real":
        raw = request.getfixturevalue("real_redis")
        port = raw.connection_pool.connection_kwargs["port"]
        async_redis = redis.asyncio.Redis(host="127.0.0.1", port=port)
        client = AsyncTokenClient.from_redis(async_redis, retry=FAST_RETRY)
    elif kind == "http-inproc":
        raw = request.getfixturevalue("fake_redis")
        transport = AsyncWSGITransport(inproc_app(raw))
        client = AsyncTokenClient("http://token-service", API_KEY, retry=FAST_RETRY, transport=transport)
    else:
        raw = request.getfixturevalue("real_redis")
        gunicorn_server: Gunicorn = request.getfixturevalue("gunicorn")
        client = AsyncTokenClient(gunicorn_server.url, API_KEY, retry=FAST_RETRY)
    async with client:
        yield Sdk(kind, client, raw)
    if async_redis is not None:
        # a client handed to from_redis belongs to the caller: close it here
        await async_redis.aclose()
