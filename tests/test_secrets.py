"""No raw token at rest in Redis, and none in the service's logs."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.processes import Gunicorn, RedisServer
from tests.support.service import AUTH, service_env

SCOPE = "payment.create"


def drive_every_operation(client: Any) -> list[str]:
    """Traffic touching every route; returns the raw tokens it used."""
    tokens = [
        client.post("/token/generate", json={"scope": SCOPE, "subject": "u"}).json()["token"]
        for _ in range(3)
    ]
    batch = client.post("/token/generate/batch", json={"scope": SCOPE, "count": 5}).json()["tokens"]
    tokens += [item["token"] for item in batch]
    client.post("/token/consume", json={"token": tokens[0], "scope": SCOPE, "subject": "u"}, headers=AUTH)
    client.post("/token/consume", json={"token": tokens[0], "scope": SCOPE, "subject": "u"}, headers=AUTH)
    client.post("/token/consume", json={"token": tokens[1], "scope": "wrong", "subject": "u"}, headers=AUTH)
    lease = client.post(
        "/token/begin", json={"token": tokens[2], "scope": SCOPE, "subject": "u"}, headers=AUTH
    )
    lease_id = lease.json()["lease_id"]
    client.post(
        "/token/complete", json={"token": tokens[2], "lease_id": lease_id, "result": {"r": 1}}, headers=AUTH
    )
    client.post("/token/begin", json={"token": tokens[2], "scope": SCOPE, "subject": "u"}, headers=AUTH)
    lease = client.post("/token/begin", json={"token": tokens[3], "scope": SCOPE}, headers=AUTH).json()
    client.post(
        "/token/fail",
        json={"token": tokens[3], "lease_id": lease["lease_id"], "retryable": False},
        headers=AUTH,
    )
    client.post("/token/inspect", json={"token": tokens[4]}, headers=AUTH)
    client.post("/token/revoke", json={"token": tokens[5]}, headers=AUTH)
    client.post("/token/consume", json={"token": tokens[6]}, headers=AUTH)  # invalid: no scope
    return tokens


def in_process(app: Any) -> httpx.Client:
    return httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://testserver")


def test_a_dump_of_redis_holds_no_usable_token(app: Any, redis_client: Any) -> None:
    with in_process(app) as http:
        tokens = drive_every_operation(http)
    dump = b""
    for key in redis_client.scan_iter("*"):
        dump += key + b"\n" + redis_client.get(key) + b"\n"
    assert dump, "the traffic should have left records"
    for token in tokens:
        assert token.encode() not in dump
        # not even a long fragment of one
        assert token[:16].encode() not in dump


def test_the_in_process_log_holds_no_token(app: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with in_process(app) as http:
        tokens = drive_every_operation(http)
    logged = "\n".join(record.getMessage() for record in caplog.records)
    for token in tokens:
        assert token not in logged


@pytest.fixture
def gunicorn_service(redis_server: RedisServer) -> Iterator[Gunicorn]:
    server = Gunicorn(service_env(redis_server.url), workers=2).start()
    yield server
    server.stop()


@pytest.mark.real
@pytest.mark.slow
def test_the_service_log_holds_no_token(gunicorn_service: Gunicorn) -> None:
    with httpx.Client(base_url=gunicorn_service.url, timeout=10) as http:
        tokens = drive_every_operation(http)
    gunicorn_service.stop()
    log = gunicorn_service.log()
    assert "/token/consume" in log, "the access log should have recorded the traffic"
    for token in tokens:
        assert token not in log
