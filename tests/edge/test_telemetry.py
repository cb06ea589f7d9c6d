"""Request ids, access lines and metrics, in process (the gunicorn tests check them across workers)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
import redis
from prometheus_client import REGISTRY
from pythonjsonlogger.json import JsonFormatter
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.processes import free_port
from tests.support.service import AUTH
from token_service import create_app
from token_service.server.logs import JSON_FORMAT, RequestIdFilter
from token_service.server.metric_files import OTHER_SCOPE, ScopeLabels
from token_service.server.metrics import TOKEN_REF_CHARS


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def client(make_client: Callable[..., Any]) -> Any:
    return make_client(rate_limit="off", max_outstanding_per_subject=0)


def test_a_sane_request_id_is_kept_and_returned(client: Any) -> None:
    response = client.get("/healthz", headers={"X-Request-ID": "abc-123.x:y_z"})
    assert response.headers["X-Request-ID"] == "abc-123.x:y_z"


@pytest.mark.parametrize("offered", ["", "a" * 129, "has space", "tab\tin", 'quote"', "<script>"])
def test_an_insane_request_id_is_replaced(client: Any, offered: str) -> None:
    response = client.get("/healthz", headers={"X-Request-ID": offered} if offered else {})
    returned = response.headers["X-Request-ID"]
    assert returned != offered
    assert len(returned) == 32


def test_errors_carry_a_request_id_too(client: Any) -> None:
    assert "X-Request-ID" in client.post("/token/consume", json={}).headers  # 401
    assert "X-Request-ID" in client.get("/no/such/route").headers  # 404


@pytest.fixture
def access_lines() -> Any:
    """The access log as the JSON lines gunicorn would print."""
    records: list[str] = []
    formatter = JsonFormatter(JSON_FORMAT)

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(formatter.format(record))

    handler = Capture()
    handler.addFilter(RequestIdFilter())
    logger = logging.getLogger("token_service.access")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def test_one_json_access_line_per_request_without_tokens(client: Any, access_lines: list[str]) -> None:
    token = client.post("/token/generate", json={"scope": "pay"}).json["token"]
    consumed = client.post(
        "/token/consume", json={"token": token, "scope": "pay"}, headers={**AUTH, "X-Request-ID": "req-42"}
    )
    assert consumed.status_code == 200
    client.get("/secret-path/" + token)  # a client that puts a token in a URL: not logged either

    lines = [json.loads(line) for line in access_lines]
    assert len(lines) == 3
    assert [line["route"] for line in lines] == ["/token/generate", "/token/consume", "unmatched"]
    assert lines[1]["request_id"] == "req-42"
    assert lines[1]["status"] == 200
    assert len(lines[1]["token_ref"]) == TOKEN_REF_CHARS
    assert all(line["request_id"] for line in lines)
    assert not any(token in line or token[:12] in line for line in access_lines)


def test_outcomes_replays_and_issued_are_counted(make_client: Callable[..., Any]) -> None:
    # a configured scope: labelled from its first (anonymous) issuance on
    client = make_client(rate_limit="off", max_outstanding_per_subject=0, metric_scopes="metrics.test")
    issued = sample("token_service_tokens_issued_total", scope="metrics.test")
    consumed = sample(
        "token_service_token_outcomes_total", operation="consume", code="consumed", scope="metrics.test"
    )
    used = sample(
        "token_service_token_outcomes_total", operation="consume", code="token_used", scope="metrics.test"
    )
    replays = sample("token_service_replays_total", operation="consume")

    body = {"scope": "metrics.test", "count": 2}
    tokens = [t["token"] for t in client.post("/token/generate/batch", json=body).json["tokens"]]
    use = {"token": tokens[0], "scope": "metrics.test", "request_id": "r1"}
    client.post("/token/consume", json=use, headers=AUTH)
    client.post("/token/consume", json=use, headers=AUTH)  # same request id: a replay
    client.post("/token/consume", json={**use, "request_id": "r2"}, headers=AUTH)  # token_used

    assert sample("token_service_tokens_issued_total", scope="metrics.test") == issued + 2
    assert (
        sample(
            "token_service_token_outcomes_total", operation="consume", code="consumed", scope="metrics.test"
        )
        == consumed + 2
    )
    assert (
        sample(
            "token_service_token_outcomes_total", operation="consume", code="token_used", scope="metrics.test"
        )
        == used + 1
    )
    assert sample("token_service_replays_total", operation="consume") == replays + 1


def test_metrics_endpoint_serves_the_text_format(client: Any) -> None:
    client.get("/healthz")
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    assert b'token_service_http_requests_total{method="GET",route="/healthz",status="200"}' in response.data
    assert b"token_service_http_request_duration_seconds_bucket" in response.data


def test_redis_errors_are_counted() -> None:
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    client = create_app({"redis_client": dead, "rate_limit": "off"}).test_client()
    before = sample("token_service_redis_errors_total", route="/token/generate")
    assert client.post("/token/generate", json={"scope": "pay"}).status_code == 503
    assert sample("token_service_redis_errors_total", route="/token/generate") == before + 1
    dead.close()


def test_scope_labels_are_bounded() -> None:
    labels = ScopeLabels(limit=3)
    assert [labels(s) for s in ["a", "b", "a", "c", "d", "e", "b"]] == [
        "a",
        "b",
        "a",
        "c",
        OTHER_SCOPE,
        OTHER_SCOPE,
        "b",
    ]


def test_a_made_up_method_does_not_make_a_new_label(client: Any) -> None:
    labels = {"method": "other", "route": "unmatched", "status": "405"}
    before = sample("token_service_http_requests_total", **labels)
    for verb in ("BREW", "WHEN", "XYZZY"):
        assert client.open("/healthz", method=verb).status_code == 405
    assert sample("token_service_http_requests_total", **labels) == before + 3
    assert sample("token_service_http_requests_total", **{**labels, "method": "BREW"}) == 0


def test_readiness_follows_the_drain_file(make_client: Callable[..., Any], tmp_path: Any) -> None:
    flag = tmp_path / "draining"
    client = make_client(drain_file=str(flag))
    assert client.get("/readyz").status_code == 200
    flag.touch()
    draining = client.get("/readyz")
    assert draining.status_code == 503
    assert draining.json == {"status": "draining"}
    assert client.get("/healthz").status_code == 200  # alive all along
    flag.unlink()
    assert client.get("/readyz").status_code == 200


def test_the_access_lines_client_is_bounded(make_client: Callable[..., Any], access_lines: list[str]) -> None:
    # issue 26: TRUSTED_PROXY_HOPS=1 with no proxy in front: the client's own X-Forwarded-For
    # (5,000 characters seen) went whole into every access line
    client = make_client(rate_limit="off", trusted_proxy_hops=1)
    forged = "1" * 5000
    assert client.get("/healthz", headers={"X-Forwarded-For": forged}).status_code == 200
    assert client.get("/healthz", headers={"X-Forwarded-For": "203.0.113.9"}).status_code == 200
    first, second = (json.loads(line) for line in access_lines)
    assert len(first["client"]) <= 65
    assert first["client"].startswith("1" * 64)
    assert second["client"] == "203.0.113.9"
