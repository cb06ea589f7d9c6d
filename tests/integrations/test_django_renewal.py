"""Django: a view slower than two of its leases runs once, under gunicorn (WSGI) and uvicorn (ASGI).

The Idempotency-Key middleware (``LOCK_SECONDS: 2``, no waiting: settings_slow)
and ``@require_token(..., lease_seconds=2)`` around views whose first run lasts
until the test releases it (tests/integrations/django_project/views.py): the
claim / lease is renewed while the view runs, so the duplicates at 2.5 s and
4.5 s get 409 instead of running the view again, and a duplicate after it
finished gets the stored response. Sync views under gunicorn, ``async def``
views under uvicorn (where the middleware and the guard run on the event loop).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from tests.integrations.servers import AppServer
from tests.support.processes import RedisServer, wait_until
from token_service.client import TokenClient

pytestmark = [pytest.mark.real, pytest.mark.slow]
SETTINGS = "tests.integrations.django_project.settings_slow"
DUPLICATES_AT = (2.5, 4.5)  # past the first 2 s lease, and past two


@pytest.fixture(scope="module", params=["gunicorn", "uvicorn"])
def server(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[tuple[AppServer, str]]:
    env = {"TS_TEST_REDIS_URL": redis_server.url, "DJANGO_SETTINGS_MODULE": SETTINGS}
    if request.param == "gunicorn":
        app = "tests.integrations.django_project.wsgi:application"
        started = AppServer.gunicorn(app, env, "--config", "python:tests.integrations.gunicorn_django")
        suffix = ""
    else:
        started = AppServer.uvicorn("tests.integrations.django_project.asgi:application", env)
        suffix = "-async"
    yield started.start(), suffix
    started.stop()


def first_and_duplicates(
    url: str, headers: dict[str, str], name: str, store: redis.Redis
) -> tuple[httpx.Response, list[httpx.Response]]:
    first: list[httpx.Response] = []
    thread = threading.Thread(
        target=lambda: first.append(httpx.post(url, json={"n": 1}, headers=headers, timeout=60))
    )
    thread.start()
    duplicates: list[httpx.Response] = []
    try:
        wait_until(lambda: store.get(f"runs:{name}"), 30, interval_seconds=0.005, what="the view to start")
        started = time.monotonic()
        for at in DUPLICATES_AT:
            time.sleep(max(0.0, started + at - time.monotonic()))
            duplicates.append(httpx.post(url, json={"n": 1}, headers=headers, timeout=60))
    finally:
        store.rpush(f"release:{name}", "go")
        thread.join(60)
    return first[0], duplicates


def test_the_middleware_keeps_its_claim_while_a_slow_view_runs(
    server: tuple[AppServer, str], real_redis: redis.Redis
) -> None:
    app, suffix = server
    name = "slow_order" + suffix.replace("-", "_")
    headers = {"Idempotency-Key": f'"slow{suffix}"', "Authorization": "Bearer client-a"}
    url = f"{app.url}/api/slow-orders{suffix}"
    first, duplicates = first_and_duplicates(url, headers, name, real_redis)
    assert first.status_code == 201, f"{first.text}\nthe server's log:\n{app.log()[-4000:]}"
    for duplicate in duplicates:
        assert duplicate.status_code == 409, duplicate.text
        assert duplicate.json()["code"] == "idempotency_key_in_use"
    replay = httpx.post(url, json={"n": 1}, headers=headers, timeout=60)
    assert (replay.status_code, replay.headers["Idempotent-Replayed"]) == (201, "true")
    assert replay.json() == first.json() == {"run": 1}
    assert int(real_redis.get(f"runs:{name}") or 0) == 1


def test_require_token_keeps_its_lease_while_a_slow_view_runs(
    server: tuple[AppServer, str], real_redis: redis.Redis
) -> None:
    app, suffix = server
    name = "slow_report" + suffix.replace("-", "_")
    token = TokenClient.from_redis(real_redis).generate("report.build").token
    url = f"{app.url}/slow-reports{suffix}"
    headers: dict[str, Any] = {"Idempotency-Token": token}
    first, duplicates = first_and_duplicates(url, headers, name, real_redis)
    assert first.status_code == 201, f"{first.text}\nthe server's log:\n{app.log()[-4000:]}"
    for duplicate in duplicates:
        assert duplicate.status_code == 409, duplicate.text
        assert duplicate.json()["code"] == "token_in_progress"
    replay = httpx.post(url, json={"n": 1}, headers=headers, timeout=60)
    assert (replay.status_code, replay.headers["Idempotent-Replayed"]) == (201, "true")
    assert replay.json() == first.json() == {"run": 1}
    assert int(real_redis.get(f"runs:{name}") or 0) == 1
