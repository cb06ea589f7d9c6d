"""The hot path answers generate and consume exactly as the Flask views would.

Every scenario runs twice on an empty Redis: once through the app as built
(plain requests to the two hot routes answered by token_service.server.hot_path) and
once through the same app with the hot path removed (Flask answers
everything). Status, headers, bodies, metrics and access lines must agree,
apart from what is random per request (tokens, request ids, times).
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable
from typing import Any

import fakeredis
import pytest
from prometheus_client import REGISTRY
from werkzeug.test import EnvironBuilder

from tests.support.processes import free_port
from tests.support.service import API_KEY, AUTH
from token_service import create_app
from token_service.records import IssueRequest
from token_service.server import connections, hot_path, request_context
from token_service.server.body import guard as guard_body
from token_service.server.logs import RequestIdFilter
from token_service.server.metrics import TOKEN_REF_CHARS
from token_service.store import TokenStore
from token_service.tokens import token_digest

SCOPE = "payment.create"
# random per request, or per run: compared for shape, not value
RANDOM_FIELDS = ("token", "expires_at", "token_ref")  # token_ref: the digest of a random token
RANDOM_HEADERS = ("X-Request-ID", "Date")

Scenario = Callable[[Any, TokenStore], Any]


class Paths:
    """The same configuration built twice: with the hot path, and Flask alone."""

    def __init__(self, redis_client: Any, **config: Any) -> None:
        self.redis = redis_client  # flushed between the runs
        # a redis_url in the configuration wins over the client (the service connects there)
        client = None if "redis_url" in config else redis_client
        self.config = {"api_keys": API_KEY, "redis_client": client, **config}
        self.hot = create_app(self.config)
        self.flask = create_app(self.config)
        # outermost FinishBody (both keep it), then the hot path: the Flask-only twin skips the latter,
        # but guards the body as the hot path does for every request it hands on
        finish = self.flask.wsgi_app
        assert isinstance(finish, connections.FinishBody)
        middleware = finish.app
        assert isinstance(middleware, hot_path.HotPath)
        flask_app = middleware.app

        def flask_only(environ: Any, start_response: Any) -> Any:
            guard_body(environ, middleware.max_body_bytes, middleware.body_timeout_seconds)
            return flask_app(environ, start_response)

        finish.app = flask_only
        self.handed_on = 0
        hot = self.hot.wsgi_app.app  # type: ignore[attr-defined]
        inner = hot.app

        def counting(environ: Any, start_response: Any) -> Any:
            self.handed_on += 1
            return inner(environ, start_response)

        hot.app = counting

    def run(self, scenario: Scenario) -> tuple[Any, Any]:
        """(hot reply, Flask reply) of the scenario, each on an empty Redis."""
        replies = []
        for app in (self.hot, self.flask):
            self.redis.flushall()
            replies.append(scenario(app.test_client(), TokenStore(self.redis)))
        return replies[0], replies[1]


def normalised(response: Any) -> tuple[int, dict[str, str], Any]:
    headers = {k: v for k, v in response.headers.items() if k not in RANDOM_HEADERS}
    try:
        body = json.loads(response.data)
    except ValueError:
        body = response.data
    if isinstance(body, dict):
        body = {k: (type(v).__name__ if k in RANDOM_FIELDS else v) for k, v in body.items()}
    return response.status_code, headers, body


def assert_same(paths: Paths, scenario: Scenario, *, handed_on: bool = False) -> Any:
    before = paths.handed_on
    hot, flask = paths.run(scenario)
    assert normalised(hot) == normalised(flask)
    assert hot.headers["X-Request-ID"]
    # the hot path answered it itself, or (for what it is not built for) handed it to Flask
    assert (paths.handed_on > before) is handed_on
    return hot


@pytest.fixture
def paths(redis_client: Any) -> Paths:
    return Paths(redis_client, rate_limit="off", max_outstanding_per_subject=0)


def fresh_token(store: TokenStore, **binding: Any) -> str:
    request = IssueRequest(SCOPE, binding.get("subject"), binding.get("fingerprint"), 300)
    return store.issue(request)[0]


def consume(body: dict[str, Any], headers: dict[str, str] | None = None) -> Scenario:
    """consume of a fresh token with ``body`` (``token`` defaults to that token)."""

    def scenario(client: Any, store: TokenStore) -> Any:
        return client.post(
            "/token/consume",
            json={"token": fresh_token(store), **body},
            headers=AUTH if headers is None else headers,
        )

    return scenario


def raw_post(path: str, data: bytes, content_type: str = "application/json", **headers: str) -> Scenario:
    def scenario(client: Any, store: TokenStore) -> Any:
        return client.post(path, data=data, headers={**AUTH, "Content-Type": content_type, **headers})

    return scenario


def generate(body: dict[str, Any], **headers: str) -> Scenario:
    return lambda client, store: client.post("/token/generate", json=body, headers=headers)


@pytest.mark.parametrize(
    "body",
    [
        {"scope": SCOPE},
        {"scope": SCOPE, "subject": "user-42", "fingerprint": "device-1", "ttl_seconds": 60},
        {"scope": SCOPE, "subject": None, "fingerprint": None, "ttl_seconds": None},
        {"scope": SCOPE, "ttl_seconds": 60.0},  # the same JSON number: marshmallow decides
        {"scope": SCOPE, "subject": "ünïcødé ✓"},
        {"scope": "not a scope"},
        {"scope": SCOPE, "ttl_seconds": 0},
        {"scope": SCOPE, "ttl_seconds": "60"},
        {"scope": SCOPE, "subject": ""},
        {"scope": SCOPE, "subject": "a\nb"},
        {"scope": SCOPE, "extra": 1},
        {},
    ],
)
def test_generate_replies_agree(paths: Paths, body: dict[str, Any]) -> None:
    assert_same(paths, generate(body))


def test_a_generated_token_is_issued_and_consumable(paths: Paths) -> None:
    client = paths.hot.test_client()
    reply = client.post("/token/generate", json={"scope": SCOPE, "subject": "user-1"})
    assert reply.status_code == 201
    token = reply.json["token"]
    consumed = client.post(
        "/token/consume", json={"token": token, "scope": SCOPE, "subject": "user-1"}, headers=AUTH
    )
    assert consumed.status_code == 200, consumed.json
    assert paths.handed_on == 0


@pytest.mark.parametrize(
    "scenario",
    [
        consume({"scope": SCOPE}),
        consume({"scope": SCOPE, "request_id": "req-1"}),
        consume({"scope": "other.scope"}),  # 403 mismatch
        consume({"scope": SCOPE, "subject": "someone"}),  # 403 mismatch on the subject
        consume({"scope": SCOPE, "token": "abc"}),  # malformed: 404
        consume({"scope": SCOPE, "token": "A" * 43}),  # well-formed, unknown: 404
        consume({"scope": SCOPE, "token": 5}),  # 400
        consume({"scope": SCOPE, "request_id": ""}),
        consume({"scope": SCOPE, "surplus": True}),
        consume({"scope": SCOPE}, headers={}),  # 401
        consume({"scope": SCOPE}, headers={"Authorization": "Bearer wrong-key"}),
        consume({"scope": SCOPE}, headers={"Authorization": f"Basic {API_KEY}"}),
    ],
)
def test_consume_replies_agree(paths: Paths, scenario: Scenario) -> None:
    assert_same(paths, scenario)


def test_used_tokens_and_retries_agree(paths: Paths) -> None:
    def twice(request_id: str | None) -> Scenario:
        def scenario(client: Any, store: TokenStore) -> Any:
            body = {"token": fresh_token(store), "scope": SCOPE, "request_id": request_id}
            first = client.post("/token/consume", json=body, headers=AUTH)
            assert first.status_code == 200
            return client.post("/token/consume", json=body, headers=AUTH)

        return scenario

    replayed = assert_same(paths, twice("the-same-request"))
    assert replayed.json == {"outcome": "consumed", "replayed": True}
    used = assert_same(paths, twice(None))
    assert used.status_code == 409
    assert used.json["code"] == "token_used"


@pytest.mark.parametrize("path", ["/token/generate", "/token/consume"])
@pytest.mark.parametrize(
    "data", [b'{"scope": ', b"[1, 2]", b"null", b"\xff\xfe\x00garbage", b'{"a": NaN}', b"[" * 5000]
)
def test_bodies_that_are_not_a_json_object_agree(paths: Paths, path: str, data: bytes) -> None:
    reply = assert_same(paths, raw_post(path, data))
    assert reply.status_code == 400


def test_the_service_key_is_checked_before_the_body(paths: Paths) -> None:
    reply = assert_same(paths, raw_post("/token/consume", b"not json", Authorization="Bearer wrong"))
    assert reply.status_code == 401
    assert reply.headers["WWW-Authenticate"]


def test_a_utf16_body_and_a_charset_agree(paths: Paths) -> None:
    body = json.dumps({"scope": SCOPE}).encode("utf-16")
    assert assert_same(paths, raw_post("/token/generate", body)).status_code == 201
    utf8 = json.dumps({"scope": SCOPE}).encode()
    reply = assert_same(paths, raw_post("/token/generate", utf8, "application/json; charset=utf-8"))
    assert reply.status_code == 201


@pytest.mark.parametrize(
    ("scenario", "status"),
    [
        (raw_post("/token/generate", b'{"scope": "a.b"}', "text/plain"), 400),
        (raw_post("/token/generate", b'{"scope": "a.b"}', "application/merge-patch+json"), 201),
        (lambda client, store: client.get("/token/generate"), 405),
        (lambda client, store: client.post("/token/generate/", json={"scope": SCOPE}), 404),
    ],
)
def test_what_the_hot_path_is_not_for_goes_to_flask(paths: Paths, scenario: Scenario, status: int) -> None:
    assert assert_same(paths, scenario, handed_on=True).status_code == status


@pytest.mark.parametrize(
    ("scenario", "status"),
    [
        (raw_post("/token/consume", b"", "application/json"), 400),
        (raw_post("/token/generate", json.dumps({"scope": SCOPE, "subject": "x" * 70_000}).encode()), 413),
    ],
)
def test_bodies_refused_before_parsing_agree(paths: Paths, scenario: Scenario, status: int) -> None:
    # the hot path reads every body within the limit itself (token_service/server/body.py)
    assert assert_same(paths, scenario).status_code == status


def test_request_ids_agree(paths: Paths) -> None:
    offered = generate({"scope": SCOPE}, **{"X-Request-ID": "trace-123.abc:9"})
    assert assert_same(paths, offered).headers["X-Request-ID"] == "trace-123.abc:9"
    forged = generate({"scope": SCOPE}, **{"X-Request-ID": 'x", "level": "ERROR'})
    reply = assert_same(paths, forged)
    assert reply.headers["X-Request-ID"] != 'x", "level": "ERROR'
    assert len(reply.headers["X-Request-ID"]) == 32


def test_access_lines_and_request_metrics_agree(paths: Paths, caplog: pytest.LogCaptureFixture) -> None:
    def sample(status: str) -> float:
        labels = {"method": "POST", "route": "/token/consume", "status": status}
        return REGISTRY.get_sample_value("token_service_http_requests_total", labels) or 0.0

    def lines(app: Any) -> list[dict[str, Any]]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="token_service.access"):
            paths.redis.flushall()
            store = TokenStore(paths.redis)
            token = fresh_token(store)
            client = app.test_client()
            for _ in range(2):  # consumed, then used
                client.post("/token/consume", json={"token": token, "scope": SCOPE}, headers=AUTH)
        records = [r for r in caplog.records if r.name == "token_service.access"]
        fields = ("method", "route", "status", "client")
        assert all(r.duration_ms >= 0 and len(r.request_id) == 32 for r in records)
        assert {r.token_ref for r in records} == {token_digest(token)[:TOKEN_REF_CHARS]}
        return [{name: getattr(r, name, None) for name in fields} for r in records]

    before = (sample("200"), sample("409"))
    hot_lines = lines(paths.hot)
    assert (sample("200"), sample("409")) == (before[0] + 1, before[1] + 1)
    assert hot_lines == lines(paths.flask)
    assert [line["status"] for line in hot_lines] == [200, 409]
    assert paths.handed_on == 0


class IdCapture(logging.Handler):
    """The request id each record has when a handler of the service's kind writes it."""

    def __init__(self) -> None:
        super().__init__()
        self.addFilter(RequestIdFilter())
        self.ids: list[str | None] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.ids.append(record.request_id)  # type: ignore[attr-defined]


def test_log_lines_written_during_a_request_carry_its_id(
    paths: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(*args: Any, **kwargs: Any) -> Any:
        logging.getLogger("token_service.store").warning("about to fail")
        raise RuntimeError("a bug")

    for app in (paths.hot, paths.flask):
        monkeypatch.setattr(app.extensions["token_service"]["store"], "consume", failing)
    capture = IdCapture()
    logger = logging.getLogger("token_service.store")
    logger.addHandler(capture)
    try:
        reply = assert_same(paths, consume({"scope": SCOPE}, headers={**AUTH, "X-Request-ID": "rid-1"}))
    finally:
        logger.removeHandler(capture)
    assert reply.status_code == 500
    assert reply.json["code"] == "internal_error"
    assert "a bug" not in reply.get_data(as_text=True)
    assert capture.ids == ["rid-1", "rid-1"]
    assert request_context.request_id() is None  # nothing lingers after the request


def test_redis_down_is_503_on_both_paths() -> None:
    # nothing listens on that port: every call fails at once, as the service's client is configured
    paths = Paths(
        fakeredis.FakeRedis(),
        redis_url=f"redis://127.0.0.1:{free_port()}/0",
        rate_limit="off",
        max_outstanding_per_subject=0,
    )

    def errors() -> float:
        labels = {"route": "/token/consume"}
        return REGISTRY.get_sample_value("token_service_redis_errors_total", labels) or 0.0

    before = errors()
    reply = assert_same(paths, consume({"scope": SCOPE, "token": "A" * 43}))
    assert reply.status_code == 503
    assert reply.json["code"] == "store_unavailable"
    assert reply.headers["Retry-After"]
    assert errors() == before + 2
    assert assert_same(paths, generate({"scope": SCOPE})).status_code == 503


def test_issuance_limits_agree(redis_client: Any) -> None:
    paths = Paths(redis_client, rate_limit="2/minute", max_outstanding_per_subject=100)

    def three(client: Any, store: TokenStore) -> Any:
        for _ in range(2):
            assert client.post("/token/generate", json={"scope": SCOPE}).status_code == 201
        return client.post("/token/generate", json={"scope": SCOPE})

    reply = assert_same(paths, three)
    assert reply.status_code == 429
    assert reply.headers["Retry-After"]


def test_the_gateway_subject_header_agrees(redis_client: Any) -> None:
    paths = Paths(redis_client, rate_limit="off", max_outstanding_per_subject=0, subject_header="X-User-Id")
    ok = assert_same(paths, generate({"scope": SCOPE}, **{"X-User-Id": "user-7"}))
    assert ok.status_code == 201
    assert ok.json["subject"] == "user-7"
    assert assert_same(paths, generate({"scope": SCOPE, "subject": "me"})).status_code == 400
    assert assert_same(paths, generate({"scope": SCOPE}, **{"X-User-Id": "x" * 129})).status_code == 400
    assert assert_same(paths, generate({"scope": SCOPE})).json["subject"] is None


def test_cross_origin_requests_go_through_flask_cors(redis_client: Any) -> None:
    origin = "https://shop.example.com"
    paths = Paths(redis_client, rate_limit="off", max_outstanding_per_subject=0, cors_origins=origin)
    reply = assert_same(paths, generate({"scope": SCOPE}, Origin=origin), handed_on=True)
    assert reply.headers["Access-Control-Allow-Origin"] == origin
    # same-origin and server-to-server requests (no Origin) stay on the hot path
    assert assert_same(paths, generate({"scope": SCOPE})).status_code == 201


class BrokenInput(io.RawIOBase):
    """A request body whose client went away: reading it fails."""

    def read(self, size: int = -1) -> bytes:
        raise OSError("connection reset by peer")


@pytest.mark.parametrize(
    "damage",
    [
        lambda env: env.update({"wsgi.input": BrokenInput()}),
        lambda env: env.update({"CONTENT_LENGTH": str(int(env["CONTENT_LENGTH"]) + 10)}),  # short body
    ],
    ids=["read-fails", "short-body"],
)
@pytest.mark.parametrize("path", ["/token/generate", "/token/consume"])
def test_a_body_that_cannot_be_read_is_400_not_500(
    paths: Paths, path: str, damage: Callable[[dict[str, Any]], None], caplog: pytest.LogCaptureFixture
) -> None:
    environ = EnvironBuilder(path=path, method="POST", json={"scope": SCOPE}, headers=AUTH).get_environ()
    damage(environ)
    statuses: list[str] = []
    with caplog.at_level(logging.ERROR):
        body = b"".join(paths.hot.wsgi_app(environ, lambda status, headers: statuses.append(status)))
    assert statuses == ["400 BAD REQUEST"]
    assert json.loads(body)["code"] == "invalid_request"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert paths.handed_on == 0


def test_a_consume_without_a_key_is_401_before_its_body_is_read(paths: Paths) -> None:
    environ = EnvironBuilder(path="/token/consume", method="POST", json={"scope": SCOPE}).get_environ()
    environ["wsgi.input"] = BrokenInput()
    statuses: list[str] = []
    b"".join(paths.hot.wsgi_app(environ, lambda status, headers: statuses.append(status)))
    assert statuses == ["401 UNAUTHORIZED"]


@pytest.mark.parametrize("length", ["\u00b2", "1e3", "-5", " 12", "0x10", "9" * 13])
def test_odd_content_lengths_are_400_not_500(paths: Paths, length: str) -> None:
    environ = EnvironBuilder(path="/token/generate", method="POST", json={"scope": SCOPE}).get_environ()
    environ["CONTENT_LENGTH"] = length
    statuses: list[str] = []
    b"".join(paths.hot.wsgi_app(environ, lambda status, headers: statuses.append(status)))
    assert statuses[0].startswith(("400", "413"))
