"""Redis down → 503 store_unavailable, fail closed; Redis back (empty script cache) → works, no restart."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.processes import RedisServer
from tests.support.service import API_KEY, AUTH
from token_service import create_app

pytestmark = pytest.mark.real
SCOPE = "payment.create"


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def service(own_redis: RedisServer) -> Any:
    app = create_app({"redis_url": own_redis.url, "api_keys": API_KEY, "rate_limit": "off"})
    return app.test_client()


def assert_unavailable(response: Any) -> None:
    assert response.status_code == 503, response.data
    assert response.json["code"] == "store_unavailable"
    assert int(response.headers["Retry-After"]) >= 1


def test_redis_down_fails_closed_and_recovers_without_restart(own_redis: RedisServer, service: Any) -> None:
    token = service.post("/token/generate", json={"scope": SCOPE}).json["token"]
    assert service.get("/readyz").status_code == 200

    own_redis.kill()
    assert_unavailable(service.post("/token/generate", json={"scope": SCOPE}))
    assert_unavailable(service.post("/token/consume", json={"token": token, "scope": SCOPE}, headers=AUTH))
    assert_unavailable(service.post("/token/begin", json={"token": token, "scope": SCOPE}, headers=AUTH))
    assert_unavailable(service.get("/readyz"))
    assert service.get("/healthz").status_code == 200

    # a new process on the same port: empty data, empty script cache
    restarted = RedisServer(port=own_redis.port).start()
    try:
        fresh = service.post("/token/generate", json={"scope": SCOPE})
        assert fresh.status_code == 201
        consumed = service.post(
            "/token/consume", json={"token": fresh.json["token"], "scope": SCOPE}, headers=AUTH
        )
        assert consumed.status_code == 200
        assert service.get("/readyz").status_code == 200
    finally:
        restarted.stop()


def test_script_flush_is_survived(own_redis: RedisServer, service: Any) -> None:
    token = service.post("/token/generate", json={"scope": SCOPE}).json["token"]
    own_redis.client().script_flush()
    assert (
        service.post("/token/consume", json={"token": token, "scope": SCOPE}, headers=AUTH).status_code == 200
    )
    own_redis.client().script_flush()
    assert service.get("/readyz").status_code == 200
    store = service.application.extensions["token_service"]["store"]
    assert all(own_redis.client().script_exists(*[script.sha for script in store._scripts.values()]))
