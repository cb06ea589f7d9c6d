"""/readyz tells the truth (it fails while Redis refuses writes), a proxy nobody declared is
noticed, browser routes say ``Vary: Origin``, and a retry-unsafe consume can be refused.

All against a real redis-server (docs/configuration.md: Readiness, Proxies, Retries).
"""

from __future__ import annotations

import logging
import shutil
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.processes import RedisServer, wait_until
from tests.support.service import API_KEY, AUTH
from token_service import create_app
from token_service.server.proxies import FORWARDED_WARNING

pytestmark = pytest.mark.real
SCOPE = "payment.create"


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


def app_on(server: RedisServer, **settings: Any) -> Any:
    # no issuance limits: the session's redis-server is shared, and these tests are not about them
    limits_off = {"rate_limit": "off", "max_outstanding_per_subject": 0}
    return create_app({"api_keys": API_KEY, "redis_url": server.url, **limits_off, **settings})


def test_readyz_fails_while_redis_is_out_of_memory_with_noeviction(own_redis: RedisServer) -> None:
    http = app_on(own_redis).test_client()
    assert http.get("/readyz").status_code == 200
    admin = own_redis.client()
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", "1")  # below what is used: every write is refused (OOM)
    refused = http.get("/readyz")
    assert refused.status_code == 503
    assert refused.json["code"] == "store_unavailable"
    assert "Retry-After" in refused.headers
    assert http.post("/token/generate", json={"scope": SCOPE}).status_code == 503
    admin.config_set("maxmemory", "0")
    assert http.get("/readyz").status_code == 200
    admin.close()


def test_readyz_fails_while_redis_refuses_writes_after_a_failed_save(own_redis: RedisServer) -> None:
    http = app_on(own_redis).test_client()
    admin = own_redis.client()
    try:
        admin.config_set("save", "3600 1")  # writes stop after a failed save only where saves are configured
        admin.config_set("stop-writes-on-bgsave-error", "yes")
        shutil.rmtree(own_redis.dir)  # the next save cannot write its file (`dir` is protected config)
        admin.bgsave()
        wait_until(lambda: admin.info("persistence")["rdb_last_bgsave_status"] == "err", timeout_seconds=30)
        refused = http.get("/readyz")
        assert refused.status_code == 503
        assert "MISCONF" in refused.json["detail"]
        admin.config_set("stop-writes-on-bgsave-error", "no")
        assert http.get("/readyz").status_code == 200
    finally:
        admin.config_set("save", "")  # or the server would refuse to stop without its final save
    admin.close()


def test_readyz_fails_on_a_read_only_replica(own_redis: RedisServer, redis_server: RedisServer) -> None:
    http = app_on(own_redis).test_client()
    admin = own_redis.client()
    admin.replicaof("127.0.0.1", redis_server.port)
    try:
        wait_until(lambda: admin.info("replication")["master_link_status"] == "up", timeout_seconds=30)
        assert http.get("/readyz").status_code == 503
    finally:
        admin.replicaof("no", "one")
        admin.close()
    assert http.get("/readyz").status_code == 200


def test_an_undeclared_proxy_is_noticed_once_in_the_log_and_in_readyz(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    http = app_on(redis_server).test_client()
    assert http.get("/readyz").json == {"status": "ready"}
    with caplog.at_level(logging.WARNING, logger="token_service.server.proxies"):
        for _ in range(3):
            reply = http.post(
                "/token/generate", json={"scope": SCOPE}, headers={"X-Forwarded-For": "198.51.100.7"}
            )
            assert reply.status_code == 201
    assert caplog.text.count("TOKEN_SERVICE_TRUSTED_PROXY_HOPS is 0") == 1
    ready = http.get("/readyz")
    assert ready.status_code == 200
    assert ready.json == {"status": "ready", "warnings": [FORWARDED_WARNING]}


def test_a_declared_proxy_is_not_warned_about(redis_server: RedisServer) -> None:
    http = app_on(redis_server, trusted_proxy_hops=1).test_client()
    headers = {"X-Forwarded-For": "198.51.100.7"}
    assert http.post("/token/generate", json={"scope": SCOPE}, headers=headers).status_code == 201
    assert http.get("/readyz").json == {"status": "ready"}


def test_every_answer_of_a_browser_route_varies_on_origin(redis_server: RedisServer) -> None:
    shop = "https://shop.example"
    http = app_on(redis_server, cors_origins=shop).test_client()
    # a cacheable asset: the variant without CORS headers must not be served to the shop's page
    plain = http.get("/static/token-client.js")
    assert plain.status_code == 200
    assert "Access-Control-Allow-Origin" not in plain.headers
    assert "Origin" in plain.headers.get_all("Vary") or "Origin" in plain.headers["Vary"]
    cross = http.get("/static/token-client.js", headers={"Origin": shop})
    assert cross.headers["Access-Control-Allow-Origin"] == shop
    assert [v.strip() for v in cross.headers["Vary"].split(",")].count("Origin") == 1
    stranger = http.get("/static/token-client.js", headers={"Origin": "https://evil.example"})
    assert "Access-Control-Allow-Origin" not in stranger.headers
    assert "Origin" in stranger.headers["Vary"]
    # generate without an Origin is answered by the hot path: it says so too, errors included
    generated = http.post("/token/generate", json={"scope": SCOPE})
    assert generated.status_code == 201
    assert "Origin" in generated.headers["Vary"]
    assert "Origin" in http.post("/token/generate", json={"scope": "bad scope"}).headers["Vary"]
    assert (
        "Origin"
        in http.post("/token/generate", json={"scope": SCOPE}, headers={"Origin": shop}).headers["Vary"]
    )
    # a backend route has no CORS headers at all, whatever the Origin
    token = generated.json["token"]
    consumed = http.post("/token/consume", json={"token": token, "scope": SCOPE}, headers=AUTH)
    assert "Access-Control-Allow-Origin" not in consumed.headers


def test_consume_and_begin_without_request_id_can_be_refused(redis_server: RedisServer) -> None:
    strict = app_on(redis_server, require_request_id=True).test_client()
    for path in ("/token/consume", "/token/begin"):
        token = strict.post("/token/generate", json={"scope": SCOPE}).json["token"]
        refused = strict.post(path, json={"token": token, "scope": SCOPE}, headers=AUTH)
        assert refused.status_code == 400
        assert refused.json["code"] == "invalid_request"
        assert "request_id" in refused.json["errors"]
        # refused before Redis: the token is still usable, with a request id
        body = {"token": token, "scope": SCOPE, "request_id": "order-7-attempt"}
        assert strict.post(path, json=body, headers=AUTH).status_code == 200
        again = strict.post(path, json=body, headers=AUTH)  # the retry of a win is a win
        assert again.status_code == 200
    # the default: a consume without a request id is served (the SDK always sends one)
    lenient = app_on(redis_server).test_client()
    token = lenient.post("/token/generate", json={"scope": SCOPE}).json["token"]
    assert (
        lenient.post("/token/consume", json={"token": token, "scope": SCOPE}, headers=AUTH).status_code == 200
    )


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gunicorn", "granian"])
def test_every_worker_warns_alike_after_one_forwarded_request(redis_server: RedisServer, kind: str) -> None:
    # issue 26: the flag was per worker, so after one such request 13 of 20 /readyz warned, 7 did not
    import httpx

    from tests.support.processes import SERVERS
    from tests.support.service import service_env

    server = SERVERS[kind](service_env(redis_server.url), workers=2).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as held:
            # this connection stays with one worker; while it is held, new ones go to the other
            # first (token_service/server/accepts.py): the worker that never saw the header
            assert held.get("/readyz").json() == {"status": "ready"}
            forwarded = {"X-Forwarded-For": "198.51.100.7"}
            assert held.post("/token/generate", json={"scope": SCOPE}, headers=forwarded).status_code == 201
            answers = [httpx.get(server.url + "/readyz", timeout=30).json() for _ in range(20)]
            answers.append(held.get("/readyz").json())
        assert answers == [{"status": "ready", "warnings": [FORWARDED_WARNING]}] * 21
        assert server.log().count("TOKEN_SERVICE_TRUSTED_PROXY_HOPS is 0") == 1  # logged once per instance
    finally:
        server.stop()


# What redis-server in protected mode writes to a connection from outside the loopback
# interface as soon as it accepts it, before closing it (networking.c, protected mode).
DENIED = (
    b"-DENIED Redis is running in protected mode because protected mode is enabled and no password "
    b"is set for the default user. In this mode connections are only accepted from the loopback "
    b"interface.\r\n"
)


@pytest.fixture
def protected_mode_redis() -> Iterator[str]:
    """A Redis address that refuses every connection as protected mode does.

    A real redis-server accepts loopback connections in protected mode, so the refusal it
    gives remote clients is written here by a socket server of our own.
    """
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def refuse() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(DENIED)
                conn.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=refuse, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    stop.set()
    thread.join()
    listener.close()


def test_a_redis_in_protected_mode_is_unavailable_not_an_internal_error(protected_mode_redis: str) -> None:
    limits_off = {"rate_limit": "off", "max_outstanding_per_subject": 0}
    http = create_app({"api_keys": API_KEY, "redis_url": protected_mode_redis, **limits_off}).test_client()
    for reply in (
        http.get("/readyz"),
        http.post("/token/generate", json={"scope": SCOPE}),
        http.post("/token/consume", json={"token": "t" * 43, "scope": SCOPE}, headers=AUTH),
    ):
        assert reply.status_code == 503, reply.get_data(as_text=True)
        assert reply.json["code"] == "store_unavailable"
        assert "Retry-After" in reply.headers
        assert "DENIED" in reply.json["detail"]
