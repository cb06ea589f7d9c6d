"""Django: every kind of response behind ``@require_token`` and the Idempotency-Key middleware, under
gunicorn (WSGI) and uvicorn (ASGI), on a real redis-server: a ``FileResponse``, a
``StreamingHttpResponse``, HEAD, and transient statuses. The view runs once, nothing answers 500, a
streamed body under the caps is replayed byte for byte (``@require_token``), one that is not kept is
replayed as status and headers with ``Idempotent-Body-Omitted``, and a 429
or 503 is not replayed (the token / key is freed for the retry)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import redis

from tests.integrations.servers import AppServer
from tests.support.processes import RedisServer
from token_service.client import TokenClient

pytestmark = [pytest.mark.real, pytest.mark.slow]
SETTINGS = "tests.integrations.django_project.settings"
REPORT = b"%PDF-1.4 receipt " * 4096  # the views' file
STREAM = b"".join(b"line %04d\n" % n for n in range(100))  # the views' stream
KEY_HEADERS = {"Authorization": "Bearer client-a"}


@pytest.fixture(scope="module", params=["gunicorn", "uvicorn"])
def server(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[AppServer]:
    env = {"TS_TEST_REDIS_URL": redis_server.url, "DJANGO_SETTINGS_MODULE": SETTINGS}
    if request.param == "gunicorn":
        app = "tests.integrations.django_project.wsgi:application"
        started = AppServer.gunicorn(app, env, "--config", "python:tests.integrations.gunicorn_django")
    else:
        started = AppServer.uvicorn("tests.integrations.django_project.asgi:application", env)
    yield started.start()
    started.stop()


@pytest.fixture
def tokens(real_redis: redis.Redis) -> Iterator[TokenClient]:
    with TokenClient.from_redis(real_redis) as client:
        yield client


def runs(store: redis.Redis, name: str) -> int:
    return int(store.get(f"runs:{name}") or 0)


def send(server: AppServer, path: str, headers: dict[str, str], method: str = "POST") -> httpx.Response:
    return httpx.request(method, server.url + path, headers=headers, timeout=60)


@pytest.mark.parametrize(("kind", "body"), [("file", REPORT), ("stream", STREAM)])
def test_require_token_with_a_file_or_a_stream_runs_once(
    server: AppServer, tokens: TokenClient, real_redis: redis.Redis, kind: str, body: bytes
) -> None:
    token = tokens.generate("report.create").token
    answers = [send(server, f"/kinds/{kind}", {"Idempotency-Token": token}) for _ in range(3)]
    assert [answer.status_code for answer in answers] == [200, 200, 200], answers[0].text
    assert answers[0].content == body
    assert tokens.verify(token).state == "SUCCEEDED"
    for replay in answers[1:]:
        assert replay.headers["Idempotent-Replayed"] == "true"
        if kind == "file":  # over max_result_bytes: omitted, with its real length
            assert replay.headers["Idempotent-Body-Omitted"] == str(len(REPORT))
            assert replay.headers["Content-Type"] == "application/pdf"
            assert replay.content == b""
        else:  # under the caps: recorded as it went out, replayed byte for byte
            assert "Idempotent-Body-Omitted" not in replay.headers
            assert replay.content == STREAM
    assert runs(real_redis, f"token_{kind}") == 1


@pytest.mark.parametrize(("kind", "body"), [("file", REPORT), ("stream", STREAM)])
def test_the_middleware_with_a_file_or_a_stream_runs_once(
    server: AppServer, real_redis: redis.Redis, kind: str, body: bytes
) -> None:
    headers = {"Idempotency-Key": f'"{kind}-1"', **KEY_HEADERS}
    answers = [send(server, f"/api/kinds/{kind}", headers) for _ in range(3)]
    assert [answer.status_code for answer in answers] == [200, 200, 200], answers[0].text
    assert answers[0].content == body
    for replay in answers[1:]:
        assert replay.headers["Idempotent-Replayed"] == "true"
        assert "Idempotent-Body-Omitted" in replay.headers
        assert replay.content == b""
    if kind == "file":
        assert answers[1].headers["Idempotent-Body-Omitted"] == str(len(REPORT))
    assert runs(real_redis, f"keyed_{kind}") == 1


def test_head_of_a_file_runs_once(server: AppServer, tokens: TokenClient, real_redis: redis.Redis) -> None:
    token = tokens.generate("report.create").token
    head = send(server, "/kinds/file", {"Idempotency-Token": token}, method="HEAD")
    assert head.status_code == 200
    assert tokens.verify(token).state == "SUCCEEDED"
    again = send(server, "/kinds/file", {"Idempotency-Token": token})
    assert (again.status_code, again.headers["Idempotent-Replayed"]) == (200, "true")
    assert runs(real_redis, "token_file") == 1


@pytest.mark.parametrize("status", [429, 503])
def test_a_429_or_503_is_not_replayed(
    server: AppServer, tokens: TokenClient, real_redis: redis.Redis, status: int
) -> None:
    token = tokens.generate("report.create").token
    for prefix, name, headers in (
        ("", "token_status", {"Idempotency-Token": token}),
        ("/api", "keyed_status", {"Idempotency-Key": f'"s-{status}"', **KEY_HEADERS}),
    ):
        for attempt in range(1, 3):
            answer = send(server, f"{prefix}/kinds/status?status={status}", headers)
            assert answer.status_code == status
            assert "idempotent-replayed" not in answer.headers
            assert runs(real_redis, name) == attempt
        stored = send(server, f"{prefix}/kinds/status?status=201", headers)
        assert stored.status_code == 201
        again = send(server, f"{prefix}/kinds/status?status=201", headers)
        assert (again.status_code, again.headers["Idempotent-Replayed"]) == (201, "true")
        assert runs(real_redis, name) == 3


def test_require_token_passes_the_guard_hooks(
    server: AppServer, tokens: TokenClient, real_redis: redis.Redis
) -> None:
    """on_replay / on_conflict / on_mismatch given to Django's @require_token reach the guard."""
    token = tokens.generate("payment.create", subject="alice").token

    def hooked(token: str, user: str) -> int:
        headers = {"Idempotency-Token": token, "X-User-Id": user}
        return send(server, "/hooked", headers).status_code

    assert hooked(token, "bob") == 403  # another subject: a mismatch, the token is not used up
    assert hooked(token, "alice") == 201
    assert hooked(token, "alice") == 201  # replayed
    used = tokens.generate("payment.create", subject="alice").token
    tokens.consume(used, "payment.create", subject="alice")
    assert hooked(used, "alice") == 409  # token_used: a conflict
    counts = {name: int(real_redis.get(f"hooks:{name}") or 0) for name in ("mismatch", "replay", "conflict")}
    assert counts == {"mismatch": 1, "replay": 1, "conflict": 1}
    assert runs(real_redis, "hooked") == 1
