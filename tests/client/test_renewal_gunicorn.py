"""Under real gunicorn: views that outlast two of their leases run once.

``@require_token(..., lease_seconds=2)`` and the Idempotency-Key middleware
(``lock_seconds=2``) around slow views (tests/client/slow_views_app.py), with
duplicates at 2.5 s and 4.5 s on other worker processes: the lease (lock) is
renewed while the view runs, so each duplicate is refused with 409 instead of
running the view again, and once it finished a duplicate gets the stored
response. The view runs until the test releases it after the duplicates (a 3 s
view left the one at 2.5 s half a second on a loaded machine).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from tests.support.processes import RedisServer, start_gunicorn, wait_until
from token_service.client import TokenClient

pytestmark = [pytest.mark.real, pytest.mark.slow]

DUPLICATES_AT = (2.5, 4.5)  # past the first 2 s lease, and past two


# One gunicorn for the file: the app keeps nothing but what is in Redis, which real_redis empties
# before each test (a worker a test kills is replaced by gunicorn; two others stay up meanwhile).
@pytest.fixture(scope="module")
def slow_app_url(redis_server: RedisServer) -> Iterator[str]:
    process, port = start_gunicorn(
        "tests.client.slow_views_app:app",
        {"TEST_REDIS_URL": redis_server.url},
        *("--workers", "3", "--timeout", "60"),
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=20)


def _first_and_duplicates(
    url: str, headers: dict[str, str], name: str, store: redis.Redis
) -> tuple[Any, list[Any]]:
    """The first request, then the duplicates at DUPLICATES_AT after its view started (it counts itself
    in ``<name>:runs``), then the view's release (``<name>:release``)."""
    first: list[httpx.Response] = []

    def send_first() -> None:
        first.append(httpx.post(url, json={"n": 1}, headers=headers, timeout=30))

    thread = threading.Thread(target=send_first)
    thread.start()
    wait_until(lambda: store.get(f"{name}:runs"), 30, interval_seconds=0.005, what="the view to start")
    started = time.monotonic()
    duplicates = []
    try:
        for at in DUPLICATES_AT:
            time.sleep(max(0.0, started + at - time.monotonic()))
            duplicates.append(httpx.post(url, json={"n": 1}, headers=headers, timeout=30))
    finally:
        store.rpush(f"{name}:release", "go")
    thread.join(30)
    return first[0], duplicates


def test_require_token_view_slower_than_its_lease_runs_once(
    slow_app_url: str, real_redis: redis.Redis
) -> None:
    token = TokenClient.from_redis(real_redis).generate("report.build").token
    headers = {"Idempotency-Token": token}
    first, duplicates = _first_and_duplicates(slow_app_url + "/reports", headers, "reports", real_redis)
    assert first.status_code == 201, first.text
    for duplicate in duplicates:
        assert duplicate.status_code == 409, duplicate.text
        assert duplicate.json()["code"] == "token_in_progress"
    replay = httpx.post(slow_app_url + "/reports", json={"n": 1}, headers=headers, timeout=30)
    assert (replay.status_code, replay.headers["Idempotent-Replayed"]) == (201, "true")
    assert replay.json() == first.json() == {"run": 1}
    assert int(real_redis.get("reports:runs") or 0) == 1


def test_idempotency_key_request_slower_than_its_lock_runs_once(
    slow_app_url: str, real_redis: redis.Redis
) -> None:
    headers = {"Idempotency-Key": '"export-1"', "Authorization": "Bearer client-a"}
    first, duplicates = _first_and_duplicates(slow_app_url + "/exports", headers, "exports", real_redis)
    assert first.status_code == 201, first.text
    for duplicate in duplicates:
        assert duplicate.status_code == 409, duplicate.text
    replay = httpx.post(slow_app_url + "/exports", json={"n": 1}, headers=headers, timeout=30)
    assert (replay.status_code, replay.headers["Idempotent-Replayed"]) == (201, "true")
    assert replay.json() == first.json() == {"run": 1}
    assert int(real_redis.get("exports:runs") or 0) == 1


def test_require_token_refuses_a_body_cut_short_and_keeps_the_token(
    slow_app_url: str, real_redis: redis.Redis
) -> None:
    """gunicorn ends ``wsgi.input`` at the client's FIN: the view would see part of the body."""
    from tests.support.cut_short import post_cut_short

    client = TokenClient.from_redis(real_redis)
    token = client.generate("order.place").token
    body = b'{"order": "A-1", "amount": 1000}'
    status, headers, content = post_cut_short(
        slow_app_url,
        "/orders",
        {"Idempotency-Token": token, "Content-Type": "application/json"},
        body[:10],
        declared=len(body),
    )
    assert status == 400, content
    assert headers["content-type"] == "application/problem+json"
    assert real_redis.get("orders:runs") is None  # the view never ran
    # the token was not used: the whole request still goes through, once
    whole = httpx.post(
        slow_app_url + "/orders", content=body, headers={"Idempotency-Token": token}, timeout=30
    )
    assert whole.status_code == 201, whole.text
    assert whole.json() == {"bytes": len(body)}


@pytest.mark.parametrize(("path", "name"), [("/reports", "reports"), ("/exports", "exports")])
def test_a_worker_killed_mid_view_stops_renewing_and_its_lease_runs_out(
    slow_app_url: str, real_redis: redis.Redis, path: str, name: str
) -> None:
    """SIGKILL the worker running the first request: nothing renews its 2 s lease (lock) any more, so a
    retry runs the view once that lease ran out (gunicorn meanwhile replaces the worker)."""
    token = TokenClient.from_redis(real_redis).generate("report.build").token
    headers = {
        "Idempotency-Token": token,
        "Idempotency-Key": '"killed-1"',
        "Authorization": "Bearer client-a",
    }
    first: list[Any] = []

    def send_first() -> None:
        try:
            first.append(httpx.post(slow_app_url + path, json={"n": 1}, headers=headers, timeout=30))
        except httpx.HTTPError as exc:  # the worker died under it
            first.append(exc)

    thread = threading.Thread(target=send_first)
    thread.start()
    pid = int(wait_until(lambda: real_redis.get(f"{name}:pid"), 30, interval_seconds=0.005, what="the view"))
    time.sleep(3)  # past the first lease: held only because it is renewed
    assert httpx.post(slow_app_url + path, json={"n": 1}, headers=headers, timeout=30).status_code == 409
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    thread.join(30)
    retried = wait_until(
        lambda: (
            (
                answer := httpx.post(slow_app_url + path, json={"n": 1}, headers=headers, timeout=30)
            ).status_code
            == 201
            and answer
        ),
        30,
        interval_seconds=0.1,
        what="the dead worker's lease to run out",
    )
    # the 2 s lease ran out on its own (were anything still renewing it, every retry would get 409)
    assert time.monotonic() - killed_at < 15
    assert retried.json() == {"run": 2}
    assert int(real_redis.get(f"{name}:runs") or 0) == 2
