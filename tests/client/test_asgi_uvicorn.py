"""The ASGI Idempotency-Key middleware on a real uvicorn, with a Starlette app and a FastAPI app."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis

from tests.support.cut_short import post_cut_short
from tests.support.processes import (
    REPO_ROOT,
    RedisServer,
    answers_healthz,
    start_serving,
    wait_until,
)

pytestmark = [pytest.mark.real, pytest.mark.slow]
KEY = '"8e03978e-40d5-43e8-bc93-6894a57f9324"'
ALICE = "Bearer alice"


@dataclass
class Server:
    url: str
    redis: redis.Redis

    def post(
        self, body: Any, key: str | None = KEY, user: str | None = ALICE, **kwargs: Any
    ) -> httpx.Response:
        headers = {k: v for k, v in (("Idempotency-Key", key), ("Authorization", user)) if v is not None}
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
        return httpx.post(self.url + "/orders", content=content, headers=headers, timeout=30, **kwargs)

    @property
    def runs(self) -> int:
        return int(self.redis.get("orders:runs") or 0)


def start_uvicorn(app: str, redis_url: str, **env: str) -> tuple[subprocess.Popen[bytes], str]:
    def launch(port: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                f"tests.client.asgi_apps:{app}",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            cwd=REPO_ROOT,
            env={**os.environ, "TEST_REDIS_URL": redis_url, **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    process, port = start_serving(launch, answers_healthz(), "uvicorn")
    return process, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module", params=["starlette_app", "fastapi_app"])
def uvicorn_url(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[str]:
    process, url = start_uvicorn(request.param, redis_server.url)
    try:
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)


@pytest.fixture
def server(uvicorn_url: str, real_redis: redis.Redis) -> Server:
    return Server(uvicorn_url, real_redis)


def test_first_request_runs_and_a_repeat_is_replayed(server: Server) -> None:
    first = server.post({"item": "book"})
    assert first.status_code == 201
    assert "idempotent-replayed" not in first.headers
    for _ in range(2):
        again = server.post({"item": "book"})
        assert again.status_code == 201
        assert again.content == first.content
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.headers["Location"] == first.headers["Location"]
        assert "set-cookie" not in again.headers
    # reordered keys and other whitespace are the same request
    assert server.post(b'{ "item" : "book" }').headers["Idempotent-Replayed"] == "true"
    assert server.runs == 1


def test_a_body_cut_short_runs_nothing_and_leaves_the_key_free(server: Server) -> None:
    head = {"Idempotency-Key": '"cut-short"', "Authorization": ALICE, "Content-Type": "application/json"}
    body = json.dumps({"sku": "A", "note": "0123456789"}).encode()
    before = server.runs
    # 10 of the declared bytes, then FIN: uvicorn hands the app http.disconnect (no one reads a reply)
    post_cut_short(server.url, "/orders", head, body[:10], len(body))
    retry = httpx.post(server.url + "/orders", content=body, headers=head, timeout=30)
    assert retry.status_code == 201, retry.text  # not 409 or 422 idempotency_key_mismatch
    assert retry.json()["note"] == "0123456789"
    assert server.runs == before + 1


def test_the_error_table(server: Server) -> None:
    def problem(response: httpx.Response) -> tuple[int, str]:
        assert response.headers["Content-Type"] == "application/problem+json"
        return response.status_code, response.json()["code"]

    assert problem(server.post({"item": "a"}, key=None)) == (400, "invalid_request")
    assert problem(server.post({"item": "a"}, key='"é"'.encode())) == (
        400,
        "invalid_request",
    )
    assert problem(server.post({"item": "a"}, key="x" * 300)) == (400, "invalid_request")
    assert problem(server.post({"item": "a"}, user=None)) == (400, "idempotency_identity_required")
    assert problem(server.post({"blob": "x" * 2_000_000}, key='"big"')) == (413, "payload_too_large")
    assert server.runs == 0
    assert server.post({"item": "a"}).status_code == 201
    assert problem(server.post({"item": "b"})) == (422, "idempotency_key_mismatch")
    # another client's same key is its own
    assert server.post({"item": "b"}, user="Bearer bob").status_code == 201
    assert server.runs == 2
    # two Idempotency-Key fields: refused, neither run (issue 26)
    headers = [("Authorization", ALICE), ("Idempotency-Key", '"two-a"'), ("Idempotency-Key", '"two-b"')]
    twice = httpx.post(server.url + "/orders", json={"item": "c"}, headers=headers, timeout=30)
    assert problem(twice) == (400, "idempotency_key_repeated")
    assert server.runs == 2


def test_a_repeat_while_the_first_runs_is_409_with_retry_after(server: Server) -> None:
    results: list[httpx.Response] = []
    # 5 s: the repeat must land while the first still runs, however slowly this process notices its start
    slow = threading.Thread(target=lambda: results.append(server.post({"sleep": 5}, key='"slow"')))
    slow.start()
    wait_until(lambda: server.runs == 1, 30, what="the first request to start")
    busy = server.post({"sleep": 5}, key='"slow"')
    slow.join()
    assert busy.status_code == 409
    assert busy.json()["code"] == "idempotency_key_in_use"
    assert 1 <= int(busy.headers["Retry-After"]) <= 30
    assert results[0].status_code == 201
    assert server.post({"sleep": 5}, key='"slow"').headers["Idempotent-Replayed"] == "true"
    assert server.runs == 1


@pytest.mark.parametrize("status", [408, 409, 425, 429, 500, 503])
def test_transient_answers_and_exceptions_are_not_replayed(server: Server, status: int) -> None:
    for _ in range(2):
        response = server.post({"status": status})
        assert response.status_code == status
        assert "idempotent-replayed" not in response.headers
    assert server.post({"crash": True}, key='"k2"').status_code == 500
    assert server.post({"crash": True}, key='"k2"').status_code == 500
    assert server.redis.keys("ts:ik:*") == []
    assert server.runs == 4


def test_a_large_stream_passes_through_and_is_stored_omitted(server: Server) -> None:
    # 4 MB in 64 KB chunks, over the 256 KB storage cap
    with httpx.Client(timeout=60) as client:
        headers = {"Idempotency-Key": '"stream"', "Authorization": ALICE, "Content-Type": "application/json"}
        received = 0
        with client.stream(
            "POST", server.url + "/orders", json={"stream": 64, "chunk": 65536}, headers=headers
        ) as r:
            assert r.status_code == 200
            for chunk in r.iter_bytes():
                received += len(chunk)
        assert received == 64 * 65536
        again = client.post(server.url + "/orders", json={"stream": 64, "chunk": 65536}, headers=headers)
    assert again.status_code == 200
    assert again.headers["Idempotent-Body-Omitted"] == str(64 * 65536)
    assert again.content == b""
    assert server.runs == 1


def test_a_file_response_is_replayed(server: Server) -> None:
    first = server.post({"file": True})
    assert first.status_code == 200
    assert first.content == b"receipt " * 512
    again = server.post({"file": True})
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert server.runs == 1


def test_concurrent_duplicates_run_once_and_get_409_or_the_response(server: Server) -> None:
    barrier = threading.Barrier(8)
    answers: list[httpx.Response] = []

    def send() -> None:
        barrier.wait()
        answers.append(server.post({"sleep": 0.5, "sku": "A"}, key='"race"'))

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert server.runs == 1
    statuses = sorted(answer.status_code for answer in answers)
    assert statuses.count(201) >= 1
    assert set(statuses) <= {201, 409}
    originals = [a for a in answers if a.status_code == 201 and "idempotent-replayed" not in a.headers]
    assert len(originals) == 1


@pytest.mark.parametrize("app", ["starlette_app", "fastapi_app"])
def test_concurrent_duplicates_that_wait_all_get_the_same_result(
    app: str, redis_server: RedisServer, real_redis: redis.Redis
) -> None:
    process, url = start_uvicorn(app, redis_server.url, TEST_WAIT_SECONDS="20")
    try:
        server = Server(url, real_redis)
        barrier = threading.Barrier(10)
        answers: list[httpx.Response] = []

        def send() -> None:
            barrier.wait()
            answers.append(server.post({"sleep": 1, "sku": "A"}, key='"wait"'))

        threads = [threading.Thread(target=send) for _ in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert server.runs == 1
        assert [a.status_code for a in answers] == [201] * 10
        assert len({a.content for a in answers}) == 1
        assert sum("idempotent-replayed" not in a.headers for a in answers) == 1
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_redis_down_fails_closed_with_503(redis_server: RedisServer, real_redis: redis.Redis) -> None:
    # the counter lives on the real server; the middleware's store is a port nothing listens on
    # (port 1: one free_port() found free may be another xdist worker's redis-server by then)
    dead = "redis://127.0.0.1:1/0"
    process, url = start_uvicorn("fastapi_app", redis_server.url, TEST_STORE_URL=dead)
    try:
        response = Server(url, real_redis).post({"item": "a"})
        assert response.status_code == 503
        assert response.json()["code"] == "store_unavailable"
        assert int(real_redis.get("orders:runs") or 0) == 0
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_a_client_that_leaves_mid_stream_leaves_the_work_recorded(server: Server) -> None:
    headers = {"Idempotency-Key": '"gone"', "Authorization": ALICE, "Content-Type": "application/json"}
    body = b'{"stream": 2000, "chunk": 65536}'  # 131 MB: far from done when the client leaves
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", server.url + "/orders", content=body, headers=headers) as response,
    ):
        assert response.status_code == 200
        next(response.iter_raw())
    answers: list[httpx.Response] = []

    def settled() -> bool:
        answers.append(httpx.post(server.url + "/orders", content=body, headers=headers, timeout=30))
        return answers[-1].status_code != 409

    wait_until(settled, 60, what="the abandoned request to be recorded")
    replay = answers[-1]
    assert replay.status_code == 200
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert int(replay.headers["Idempotent-Body-Omitted"]) > 0
    assert server.runs == 1


def test_a_request_whose_lock_ran_out_is_fenced_out(server: Server) -> None:
    """The first request's claim runs out while it runs (as when its process stalls past
    ``lock_seconds``); a second request takes the key and stores its response. The first then
    finishes: its response must not overwrite the second's (the store is fenced by owner)."""
    slow = threading.Thread(target=lambda: first.append(server.post({"sleep": 3, "sku": "A"})))
    first: list[httpx.Response] = []
    slow.start()
    wait_until(lambda: server.runs == 1, 30, what="the first request to start")
    [record] = server.redis.keys("ts:ik:*")
    server.redis.pexpire(record, 1)  # its lock runs out
    wait_until(lambda: not server.redis.exists(record), 10, what="the lock to run out")
    second = server.post({"sku": "A", "second": True})
    assert second.status_code == 201
    slow.join(60)
    assert first[0].status_code == 201  # its client still gets its answer
    assert server.runs == 2
    replay = server.post({"sku": "A", "second": True})
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.content == second.content  # the second's response, not the late first one's
    assert server.post({"sleep": 3, "sku": "A"}).json()["code"] == "idempotency_key_mismatch"
    assert server.runs == 2


def test_a_server_killed_mid_request_frees_the_key_after_its_lock(
    redis_server: RedisServer, real_redis: redis.Redis
) -> None:
    """uvicorn SIGKILLed while the app runs: nothing stores or frees the key and nothing renews
    its claim, which runs out within lock_seconds (2 s here); then the key is free again."""
    process, url = start_uvicorn("starlette_app", redis_server.url, TEST_LOCK_SECONDS="2")
    server = Server(url, real_redis)
    try:
        thread = threading.Thread(target=post_ignoring_errors, args=(server, {"sleep": 60}))
        thread.start()
        wait_until(lambda: server.runs == 1, 30, what="the app to start")
    finally:
        process.kill()  # SIGKILL: no settle, no release, no more renewals
        process.wait(timeout=20)
    thread.join(30)
    for record in real_redis.keys("ts:ik:*"):  # (gone already, should this process have been slow)
        assert real_redis.pttl(record) <= 2000
    process, url = start_uvicorn("starlette_app", redis_server.url, TEST_LOCK_SECONDS="2")
    try:
        heir = Server(url, real_redis)
        answers: list[httpx.Response] = []

        def retried() -> bool:
            answers.append(heir.post({"sleep": 0}))
            return answers[-1].status_code != 422  # the dead request's live claim: another request

        wait_until(retried, 30, interval_seconds=0.1, what="the dead request's lock to run out")
        assert answers[-1].status_code == 201, [a.status_code for a in answers]
        assert "idempotent-replayed" not in answers[-1].headers
        assert server.runs == 2
    finally:
        process.terminate()
        process.wait(timeout=20)


def post_ignoring_errors(server: Server, body: Any) -> None:
    with contextlib.suppress(httpx.HTTPError):
        server.post(body)
