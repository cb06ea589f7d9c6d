"""The SDK over HTTP keeps its connections: 1000 sequential consumes open at most 2 TCP connections.

The service runs with the shipped gunicorn configuration (worker class and
keep-alive as a user gets them); a counting TCP proxy in front of it sees
every connection the SDK opens.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.processes import SERVERS, Gunicorn, RedisServer
from tests.support.service import API_KEY
from tests.support.tcp_proxy import FaultProxy
from token_service.client import AsyncTokenClient, TokenClient

pytestmark = [pytest.mark.real, pytest.mark.slow]

CONSUMES = 1000
SCOPE = "reuse.test"


@pytest.fixture(scope="module", params=sorted(SERVERS))
def service(request: pytest.FixtureRequest) -> Iterator[Gunicorn]:
    redis_server = RedisServer().start()
    server = SERVERS[request.param](
        {
            "TOKEN_SERVICE_REDIS_URL": redis_server.url,
            "TOKEN_SERVICE_API_KEYS": API_KEY,
            "TOKEN_SERVICE_RATE_LIMIT": "off",
            "TOKEN_SERVICE_MAX_OUTSTANDING_PER_SUBJECT": "0",  # no cap: 1000 tokens at once
        },
        workers=2,
    ).start()
    yield server
    server.stop()
    redis_server.stop()


def _tokens(service: Gunicorn, count: int) -> list[str]:
    """Minted straight at the service, not through the proxy under test."""
    tokens: list[str] = []
    with httpx.Client(base_url=service.url, timeout=30) as http:
        while len(tokens) < count:
            batch = min(1000, count - len(tokens))
            reply = http.post("/token/generate/batch", json={"scope": SCOPE, "count": batch})
            assert reply.status_code == 201, reply.text
            tokens += [item["token"] for item in reply.json()["tokens"]]
    return tokens


def test_sync_client_reuses_its_connection_for_1000_consumes(service: Gunicorn) -> None:
    tokens = _tokens(service, CONSUMES)
    with (
        FaultProxy(("127.0.0.1", service.port)) as proxy,
        TokenClient(f"http://127.0.0.1:{proxy.port}", api_key=API_KEY, timeout=30) as client,
    ):
        outcomes = [client.consume(token, SCOPE).replayed for token in tokens]
        accepted = proxy.stats.accepted
    assert outcomes == [False] * CONSUMES  # each a first win
    assert 1 <= accepted <= 2, f"{accepted} TCP connections for {CONSUMES} consumes"


async def test_async_client_reuses_its_connection(service: Gunicorn) -> None:
    tokens = _tokens(service, 200)
    with FaultProxy(("127.0.0.1", service.port)) as proxy:
        async with AsyncTokenClient(f"http://127.0.0.1:{proxy.port}", api_key=API_KEY, timeout=30) as client:
            outcomes = [(await client.consume(token, SCOPE)).replayed for token in tokens]
        accepted = proxy.stats.accepted
    assert outcomes == [False] * len(tokens)
    assert 1 <= accepted <= 2, f"{accepted} TCP connections for {len(tokens)} consumes"
