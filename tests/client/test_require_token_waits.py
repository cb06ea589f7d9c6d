"""A double click while the first request runs: by default the duplicate waits for the first
response and gets it replayed; refused (``wait_seconds=0``, or past the wait), its
``Retry-After`` estimates how long the view takes instead of quoting the lease.

Before, a duplicate got ``409 token_in_progress`` with ``Retry-After: 30`` (the lease) at once,
though the first request finished in milliseconds. Flask here; FastAPI and Django share the
decision (client/_require_token_core.py, held to the same answers by the parity test).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
from flask import Flask

from token_service.client import TokenClient, TokenInProgress
from token_service.client._require_token_core import RequireToken
from token_service.client.flask import require_token

SCOPE = "payment.create"


@pytest.fixture
def client() -> Iterator[TokenClient]:
    with TokenClient.from_redis(fakeredis.FakeRedis(server=fakeredis.FakeServer())) as made:
        yield made


def app_with_a_slow_view(
    client: TokenClient, **options: Any
) -> tuple[Flask, threading.Event, threading.Event]:
    """A view that runs until ``release`` is set (``entered`` says it is running)."""
    app = Flask(__name__)
    entered, release = threading.Event(), threading.Event()

    @app.post("/pay")
    @require_token(client, SCOPE, **options)
    def pay() -> Any:
        entered.set()
        assert release.wait(60)
        return {"paid": True}, 201

    return app, entered, release


def first_request(app: Flask, token: str) -> tuple[threading.Thread, list[Any]]:
    answers: list[Any] = []
    thread = threading.Thread(
        target=lambda: answers.append(app.test_client().post("/pay", headers={"Idempotency-Token": token}))
    )
    thread.start()
    return thread, answers


def test_a_duplicate_refused_at_once_is_told_about_a_second_not_the_lease(client: TokenClient) -> None:
    app, entered, release = app_with_a_slow_view(client, wait_seconds=0)
    token = client.generate(SCOPE).token
    thread, answers = first_request(app, token)
    assert entered.wait(30)
    duplicate = app.test_client().post("/pay", headers={"Idempotency-Token": token})
    release.set()
    thread.join(30)
    assert duplicate.status_code == 409
    assert duplicate.json["code"] == "token_in_progress"
    assert duplicate.headers["Retry-After"] == "1"  # was "30": the default lease
    assert answers[0].status_code == 201


def test_by_default_a_duplicate_waits_for_the_first_response(client: TokenClient) -> None:
    app, entered, release = app_with_a_slow_view(client)
    token = client.generate(SCOPE).token
    thread, answers = first_request(app, token)
    assert entered.wait(30)
    # the first finishes while the duplicate waits (a double click: milliseconds apart)
    threading.Timer(0.2, release.set).start()
    duplicate = app.test_client().post("/pay", headers={"Idempotency-Token": token})
    thread.join(30)
    assert answers[0].status_code == 201
    assert duplicate.status_code == 201, duplicate.get_data(as_text=True)  # was 409 token_in_progress
    assert duplicate.headers["Idempotent-Replayed"] == "true"
    assert duplicate.json == answers[0].json


@pytest.mark.parametrize(
    ("typical_seconds", "lease_left_seconds", "told"),
    [(None, 30, 1), (0.004, 30, 1), (2.3, 30, 3), (45.0, 30, 30), (10.0, 2, 2)],
)
def test_the_retry_after_is_the_typical_run_time_within_the_lease(
    typical_seconds: float | None, lease_left_seconds: int, told: int
) -> None:
    core = RequireToken(SCOPE)
    core._typical_seconds = typical_seconds
    refused = core._refusal(TokenInProgress("held", retry_after_seconds=lease_left_seconds))
    assert isinstance(refused, TokenInProgress)
    assert refused.retry_after_seconds == told
