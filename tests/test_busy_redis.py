"""A Redis busy with a long script (BUSY) is a 503 store_unavailable, and the service
answers again once the script is gone."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest
import redis

from tests.support.processes import RedisServer, wait_until
from token_service.errors import ServiceUnavailable
from token_service.store import translate_errors

SCOPE = "payment.create"


def test_a_busy_redis_is_503() -> None:
    with pytest.raises(ServiceUnavailable), translate_errors():
        raise redis.exceptions.ResponseError("BUSY Redis is busy running a script.")


@pytest.fixture
def impatient_redis() -> Iterator[RedisServer]:
    server = RedisServer("--busy-reply-threshold", "50").start()
    yield server
    server.stop()


@pytest.mark.real
def test_a_script_hogging_redis_gives_503_then_service_resumes(impatient_redis: RedisServer) -> None:
    from token_service import create_app

    app = create_app({"redis_url": impatient_redis.url, "api_keys": "k" * 20, "rate_limit": "off"})
    client = app.test_client()
    hog = threading.Thread(
        target=lambda: _run_quietly(impatient_redis.client(), "local i = 0 while true do i = i + 1 end")
    )
    hog.start()
    try:
        # past the busy threshold Redis answers BUSY to everyone else: wait for that, not for a time
        wait_until(lambda: _answers_busy(impatient_redis), 30, what="Redis to answer BUSY")
        busy = client.post("/token/generate", json={"scope": SCOPE})
        assert busy.status_code == 503, busy.data
        assert busy.json["code"] == "store_unavailable"
    finally:
        impatient_redis.client().script_kill()
        hog.join(timeout=10)
    assert client.post("/token/generate", json={"scope": SCOPE}).status_code == 201


def _run_quietly(connection: redis.Redis, script: str) -> None:
    with contextlib.suppress(redis.exceptions.ResponseError):  # SCRIPT KILL ends it, as intended
        connection.eval(script, 0)


def _answers_busy(server: RedisServer) -> bool:
    with server.client() as other:
        try:
            other.ping()
        except redis.exceptions.BusyLoadingError:
            return True
        except redis.exceptions.ResponseError as exc:
            return str(exc).startswith("BUSY")
    return False
