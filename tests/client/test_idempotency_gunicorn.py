"""The Idempotency-Key middleware under gunicorn: repeats spread over worker processes run once."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from tests.support import raw_http
from tests.support.cut_short import post_cut_short
from tests.support.processes import RedisServer, start_gunicorn

pytestmark = [pytest.mark.real, pytest.mark.slow]


# One gunicorn for the file: the app keeps nothing but what is in Redis, which real_redis empties
# before each test, so a test sees a server as fresh as its own (and the file starts 1, not 7).
@pytest.fixture(scope="module")
def orders_url(redis_server: RedisServer) -> Iterator[str]:
    process, port = start_gunicorn(
        "tests.client.middleware_app:app", {"TEST_REDIS_URL": redis_server.url}, "--workers", "3"
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_simultaneous_repeats_across_workers_run_once(orders_url: str, real_redis: redis.Redis) -> None:
    headers = {"Idempotency-Key": '"order-1"', "Authorization": "Bearer client-a"}
    barrier = threading.Barrier(9)
    answers: list[httpx.Response] = []

    def send() -> None:
        with httpx.Client(timeout=10) as client:
            barrier.wait()
            answers.append(client.post(orders_url + "/orders", json={"sku": "A"}, headers=headers))

    threads = [threading.Thread(target=send) for _ in range(9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert int(real_redis.get("orders:runs") or 0) == 1
    statuses = sorted(answer.status_code for answer in answers)
    assert statuses.count(201) >= 1
    assert set(statuses) <= {201, 409}
    # after the first finished, every repeat — whichever worker takes it — is the stored response
    first: Any = None
    for _ in range(6):
        replay = httpx.post(orders_url + "/orders", json={"sku": "A"}, headers=headers, timeout=10)
        assert replay.status_code == 201
        assert replay.headers["Idempotent-Replayed"] == "true"
        first = first or replay.content
        assert replay.content == first
    assert int(real_redis.get("orders:runs") or 0) == 1
    other = httpx.post(orders_url + "/orders", json={"sku": "B"}, headers=headers, timeout=10)
    assert other.status_code == 422


@pytest.mark.parametrize("status", [429, 503])
def test_a_429_or_503_from_the_app_is_not_replayed(
    orders_url: str, real_redis: redis.Redis, status: int
) -> None:
    headers = {"Idempotency-Key": f'"retry-{status}"', "Authorization": "Bearer client-a"}
    for attempt in range(1, 4):
        response = httpx.post(f"{orders_url}/answers/{status}", json={}, headers=headers, timeout=10)
        assert response.status_code == status
        assert "idempotent-replayed" not in response.headers
        assert int(real_redis.get("answers:runs") or 0) == attempt
    assert real_redis.keys("ts:ik:*") == []


def test_a_send_file_view_runs_once_and_never_answers_500(orders_url: str, real_redis: redis.Redis) -> None:
    from token_service.client import TokenClient

    report = b"%PDF-1.4 receipt " * 4096  # what middleware_app's view sends
    with TokenClient.from_redis(real_redis) as tokens:
        token = tokens.generate("report.create").token
        headers = {"Idempotency-Token": token}
        answers = [httpx.post(orders_url + "/reports", headers=headers, timeout=10) for _ in range(3)]
        assert [answer.status_code for answer in answers] == [200, 200, 200]
        assert answers[0].content == report
        assert tokens.verify(token).state == "SUCCEEDED"
    for replay in answers[1:]:
        assert replay.headers["Idempotent-Replayed"] == "true"
        assert replay.headers["Idempotent-Body-Omitted"] == str(len(report))
        assert replay.headers["Content-Type"] == "application/pdf"
    assert int(real_redis.get("reports:runs") or 0) == 1


def test_a_body_cut_short_is_a_400_and_leaves_the_key_free(orders_url: str, real_redis: redis.Redis) -> None:
    head = {
        "Idempotency-Key": '"cut-short"',
        "Authorization": "Bearer client-a",
        "Content-Type": "application/json",
    }
    body = json.dumps({"sku": "A", "note": "0123456789"}).encode()
    runs = int(real_redis.get("orders:runs") or 0)
    status, headers, content = post_cut_short(orders_url, "/orders", head, body[:10], len(body))
    assert status == 400, content
    assert headers["content-type"] == "application/problem+json"
    problem = json.loads(content)
    assert problem["code"] == "invalid_request"
    assert "ended before its Content-Length" in problem["detail"]
    assert int(real_redis.get("orders:runs") or 0) == runs  # the app never ran on the partial body
    assert real_redis.keys("ts:ik:*") == []  # and the key was not claimed
    # the client's retry with the whole body and the same key runs (not 422 idempotency_key_mismatch)
    retry = httpx.post(orders_url + "/orders", content=body, headers=head, timeout=10)
    assert retry.status_code == 201, retry.text
    assert retry.json()["note"] == "0123456789"
    assert int(real_redis.get("orders:runs") or 0) == runs + 1


def test_a_chunked_body_cut_short_is_a_400_too(orders_url: str, real_redis: redis.Redis) -> None:
    host, _, port = orders_url.removeprefix("http://").partition(":")
    head = (
        b"POST /orders HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n"
        b'Idempotency-Key: "chunks-cut-short"\r\nAuthorization: Bearer client-a\r\n'
        b"Content-Type: application/json\r\n\r\n"
    )
    runs = int(real_redis.get("orders:runs") or 0)
    with raw_http.connect((host, int(port)), timeout=30) as sock:
        sock.sendall(head + b'20\r\n{"sku": "A"')  # a chunk of 32 bytes, 12 sent, then FIN
        sock.shutdown(socket.SHUT_WR)
        reply = raw_http.read_reply(sock, 30)
    assert reply.status == 400, reply.body
    assert reply.headers["content-type"] == "application/problem+json"
    assert reply.json()["code"] == "invalid_request"
    assert int(real_redis.get("orders:runs") or 0) == runs
    assert real_redis.keys("ts:ik:*") == []


def test_two_idempotency_key_fields_are_refused(orders_url: str, real_redis: redis.Redis) -> None:
    # gunicorn joins them as "A,B": neither key is chosen, and "A,B" is not a third one (issue 26)
    before = int(real_redis.get("orders:runs") or 0)
    for fields in (['"two-a"', '"two-b"'], ["two-a", "two-b"], ['"two-b"', '"two-a"']):
        headers = [("Authorization", "Bearer client-a"), *(("Idempotency-Key", field) for field in fields)]
        answer = httpx.post(orders_url + "/orders", json={"sku": "A"}, headers=headers, timeout=10)
        assert answer.status_code == 400, answer.text
        assert answer.headers["Content-Type"] == "application/problem+json"
        assert answer.json()["code"] == "idempotency_key_repeated"
    assert int(real_redis.get("orders:runs") or 0) == before
    assert real_redis.keys("ts:ik:*") == []
