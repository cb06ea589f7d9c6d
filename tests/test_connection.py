"""Each standalone URL scheme of the configuration reaches a real Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import RedisServer
from tests.support.service import API_KEY, AUTH, NO_BUDGET
from token_service import create_app

pytestmark = pytest.mark.real


@pytest.fixture
def socket_redis(tmp_path: Path) -> Iterator[tuple[RedisServer, Path]]:
    socket_path = tmp_path / "redis.sock"
    server = RedisServer("--unixsocket", str(socket_path), "--unixsocketperm", "700").start()
    yield server, socket_path
    server.stop()


def test_unix_socket_url(socket_redis: tuple[RedisServer, Path]) -> None:
    server, socket_path = socket_redis
    client = create_app(
        {
            "redis_url": f"unix://{socket_path}?db=0",
            "api_keys": API_KEY,
            "rate_limit": "off",
            "max_outstanding_per_subject": 0,
            **NO_BUDGET,
        }
    ).test_client()
    token = client.post("/token/generate", json={"scope": "s"}).json["token"]
    assert client.post("/token/consume", json={"token": token, "scope": "s"}, headers=AUTH).status_code == 200
    assert server.client().dbsize() == 1


def test_redis_url_with_a_database_number(redis_server: RedisServer) -> None:
    redis_server.client(db=3).flushdb()
    client = create_app(
        {
            "redis_url": redis_server.url[:-1] + "3",
            "api_keys": API_KEY,
            "rate_limit": "off",
            "max_outstanding_per_subject": 0,
            **NO_BUDGET,
        }
    ).test_client()
    client.post("/token/generate", json={"scope": "s"})
    assert redis_server.client(db=3).dbsize() == 1
    redis_server.client(db=3).flushdb()
