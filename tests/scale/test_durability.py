"""What a Redis crash or a full Redis does to tokens, through HTTP.

- ``appendfsync always``: a consume answered 200 is on disk; after ``kill -9``
  and a restart on the same directory the token stays used.
- RDB snapshots only: a consume after the last snapshot is lost by a crash and
  the token comes back usable — the hazard docs/topologies.md's durability section
  warns about, shown here so the warning stays true.
- ``maxmemory`` + ``noeviction``: generate answers 503 (never 500), existing
  tokens are not evicted, and once memory is available they are consumed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.processes import RedisServer
from tests.support.service import AUTH, service_config
from token_service import create_app

pytestmark = pytest.mark.real

SCOPE = "payment.create"


@pytest.fixture
def server_args() -> tuple[str, ...]:
    return ()


@pytest.fixture
def server(server_args: tuple[str, ...]) -> Iterator[RedisServer]:
    started = RedisServer(*server_args).start()
    yield started
    started.stop()


def app_on(server: RedisServer) -> Any:
    return create_app(service_config(server.url, redis_timeout_seconds="0.5"))


def consume(http: Any, token: str, request_id: str) -> Any:
    return http.post(
        "/token/consume", json={"token": token, "scope": SCOPE, "request_id": request_id}, headers=AUTH
    )


def generate(http: Any) -> str:
    response = http.post("/token/generate", json={"scope": SCOPE})
    assert response.status_code == 201
    return str(response.get_json()["token"])


@pytest.mark.parametrize("server_args", [("--appendonly", "yes", "--appendfsync", "always")])
def test_aof_always_a_consume_survives_kill_9(server: RedisServer) -> None:
    http = app_on(server).test_client()
    tokens = [generate(http) for _ in range(20)]
    for token in tokens:
        assert consume(http, token, "first").status_code == 200
    server.kill()  # SIGKILL right after the last 200: no shutdown, no final fsync
    server.start()  # same port and directory: Redis replays the AOF
    for token in tokens:
        again = consume(http, token, "second")
        assert again.status_code == 409
        assert again.get_json()["code"] == "token_used"
        # the winner's own retry is still recognised
        assert consume(http, token, "first").get_json() == {"outcome": "consumed", "replayed": True}


@pytest.mark.parametrize("server_args", [("--appendonly", "no")])
def test_rdb_only_a_crash_can_hand_a_used_token_out_again(server: RedisServer) -> None:
    http = app_on(server).test_client()
    token = generate(http)
    with server.client() as redis_client:
        redis_client.save()  # the last snapshot holds the token ISSUED
    assert consume(http, token, "first").status_code == 200
    server.kill()
    server.start()
    # the consume after the snapshot is lost: a second caller wins the same token
    assert consume(http, token, "second").status_code == 200


@pytest.mark.parametrize("server_args", [("--maxmemory-policy", "noeviction")])
def test_full_redis_refuses_new_tokens_with_503_and_loses_none(server: RedisServer) -> None:
    app = app_on(server)
    http = app.test_client()
    existing = [item["token"] for item in _batch(http, 200).get_json()["tokens"]]
    with server.client() as redis_client:
        used = redis_client.info("memory")["used_memory"]
        redis_client.config_set("maxmemory", used + 100_000)
        statuses: Counter[int] = Counter()
        # fill the ~100 kB of headroom; Redis's memory use moves a little with buffers,
        # so after the first 503 a later call may get in again, but never a 500
        for _ in range(300):
            response = (
                _batch(http, 20)
                if statuses[503] == 0
                else http.post("/token/generate", json={"scope": SCOPE})
            )
            statuses[response.status_code] += 1
            if response.status_code == 201:
                body = response.get_json()
                existing += [item["token"] for item in body.get("tokens", [body])]
            else:
                assert response.status_code == 503, response.get_json()
                assert response.get_json()["code"] == "store_unavailable"
                assert "Retry-After" in response.headers
            if statuses[503] >= 5:
                break
        assert set(statuses) <= {201, 503}
        assert statuses[503] >= 5, statuses
        # firmly over the limit from here on, whatever the buffers do
        redis_client.config_set("maxmemory", redis_client.info("memory")["used_memory"] - 50_000)
        assert http.post("/token/generate", json={"scope": SCOPE}).status_code == 503
        assert _batch(http, 5).status_code == 503
        # a consume writes too: Redis refuses it, and the service fails closed
        refused = consume(http, existing[0], "at-oom")
        assert refused.status_code == 503
        assert http.get("/healthz").status_code == 200
        # nothing was evicted (a batch refused half way may leave records of tokens
        # never handed out: they only expire)
        assert redis_client.dbsize() >= len(existing)
        states = {
            http.post("/token/inspect", json={"token": t}, headers=AUTH).get_json()["state"] for t in existing
        }
        assert states == {"ISSUED"}
        redis_client.config_set("maxmemory", 0)  # the operator adds memory
    outcomes = Counter(consume(http, token, "after").status_code for token in existing)
    assert outcomes == {200: len(existing)}
    print(f"\nFIGURES memory_pressure tokens_kept={len(existing)} generate_statuses={dict(statuses)}")


def _batch(http: Any, count: int) -> Any:
    return http.post("/token/generate/batch", json={"scope": SCOPE, "count": count})


@pytest.mark.parametrize("server_args", [("--maxmemory-policy", "noeviction")])
def test_full_redis_with_the_limiter_on_is_503_not_500(server: RedisServer) -> None:
    # the limiter's own script writes its counters first: Redis refuses that write too
    app = create_app(service_config(server.url, rate_limit="100000/minute", redis_timeout_seconds="0.5"))
    http = app.test_client()
    token = generate(http)
    with server.client() as redis_client:
        redis_client.config_set("maxmemory", redis_client.info("memory")["used_memory"] - 50_000)
        refused = http.post("/token/generate", json={"scope": SCOPE})
        assert refused.status_code == 503
        assert refused.get_json()["code"] == "store_unavailable"
        assert _batch(http, 10).status_code == 503
        redis_client.config_set("maxmemory", 0)
    assert consume(http, token, "after").status_code == 200
    assert http.post("/token/generate", json={"scope": SCOPE}).status_code == 201
