"""SDK telemetry: Prometheus counters (a registry of the test's own) and OpenTelemetry spans
(the OTel SDK's in-memory exporter), and the SDK working without either package."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from tests.support.processes import REPO_ROOT, RedisServer
from token_service.client import (
    AsyncTokenClient,
    ServiceUnavailable,
    Telemetry,
    TokenClient,
    TokenInProgress,
    TokenMismatch,
    TokenUsed,
)

SCOPE = "payment.create"


class Observed:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.telemetry = Telemetry(prometheus_registry=self.registry, tracer_provider=self.provider)

    def count(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(f"token_service_sdk_{name}_total", {"scope": SCOPE, **labels})
        return value or 0.0

    def outcomes(self) -> list[str]:
        return [span.attributes["token_service.outcome"] for span in self.exporter.get_finished_spans()]  # type: ignore[index,misc]


@pytest.fixture
def observed() -> Iterator[Observed]:
    found = Observed()
    yield found
    found.provider.shutdown()


@pytest.fixture
def client(observed: Observed, redis_client: Any) -> Iterator[TokenClient]:
    """On fakeredis and on a real redis-server (tests/conftest.py's ``redis_client``)."""
    with TokenClient.from_redis(redis_client, telemetry=observed.telemetry) as client:
        yield client


def test_counters_and_spans_for_each_outcome(client: TokenClient, observed: Observed) -> None:
    token = client.generate(SCOPE, subject="alice").token
    held = client.guard(token, SCOPE, subject="alice")
    assert held.start()
    with pytest.raises(TokenInProgress):
        client.guard(token, SCOPE, subject="alice").start()
    with pytest.raises(TokenMismatch):
        client.guard(token, SCOPE, subject="bob").start()
    held.succeed({"ok": 1})
    assert client.guard(token, SCOPE, subject="alice").run(lambda: "not run") == {"ok": 1}
    used = client.generate(SCOPE).token
    client.consume(used, SCOPE)
    with pytest.raises(TokenUsed):
        client.guard(used, SCOPE).run(lambda: "not run")
    released = client.generate(SCOPE).token

    def broken() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        client.guard(released, SCOPE).run(broken)

    assert observed.count("executions", outcome="succeeded") == 1
    assert observed.count("executions", outcome="released") == 1
    assert observed.count("replays") == 1
    assert observed.count("conflicts", code="token_in_progress") == 1
    assert observed.count("conflicts", code="token_used") == 1
    assert observed.count("mismatches", field="subject") == 1
    assert observed.outcomes() == ["conflict", "mismatch", "executed", "replayed", "conflict", "released"]
    spans = observed.exporter.get_finished_spans()
    assert {span.name for span in spans} == {"token_service.guard"}
    assert all(span.attributes["token_service.scope"] == SCOPE for span in spans)  # type: ignore[index]
    failed = spans[-1]
    assert failed.status.status_code == trace.StatusCode.ERROR
    assert failed.events[0].name == "exception"


def test_the_work_runs_inside_the_guard_span(client: TokenClient, observed: Observed) -> None:
    tracer = observed.provider.get_tracer("test")

    def charge() -> str:
        with tracer.start_as_current_span("charge"):
            return "ch_1"

    token = client.generate(SCOPE).token
    client.guard(token, SCOPE).run(charge)
    second = client.generate(SCOPE).token
    with client.guard(second, SCOPE) as guard:
        guard.result = charge()
    by_name: dict[str, list[Any]] = {}
    for span in observed.exporter.get_finished_spans():
        by_name.setdefault(span.name, []).append(span)
    for inner, outer in zip(by_name["charge"], by_name["token_service.guard"], strict=True):
        assert inner.parent.span_id == outer.context.span_id


def test_store_errors_are_counted(observed: Observed) -> None:
    # nothing listens on port 1: every call fails as ServiceUnavailable after the retries
    with (
        TokenClient.from_redis(
            "redis://127.0.0.1:1/0", retry=1, timeout=0.5, telemetry=observed.telemetry
        ) as dead,
        pytest.raises(ServiceUnavailable),
    ):
        dead.guard("A" * 43, SCOPE).start()
    assert observed.count("store_errors", operation="begin") == 1
    assert observed.outcomes() == ["error"]


async def test_async_guard_counts_and_traces(observed: Observed) -> None:
    server = fakeredis.FakeServer()
    raw = fakeredis.FakeAsyncRedis(server=server)
    async with AsyncTokenClient.from_redis(raw, telemetry=observed.telemetry) as client:
        token = (await client.generate(SCOPE)).token

        async def work() -> int:
            return 7

        assert await client.guard(token, SCOPE).run(work) == 7
        assert await client.guard(token, SCOPE).run(work) == 7
    await raw.aclose()
    assert observed.count("executions", outcome="succeeded") == 1
    assert observed.count("replays") == 1
    assert observed.outcomes() == ["executed", "replayed"]
    assert observed.exporter.get_finished_spans()[0].attributes["token_service.async"] is True  # type: ignore[index]


def test_without_opentelemetry_or_prometheus_the_sdk_still_works() -> None:
    """Both packages blocked from import: guards run, telemetry is a no-op."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry"] = None          # import opentelemetry -> ImportError
        sys.modules["prometheus_client"] = None
        import fakeredis
        from token_service.client import TokenClient
        from token_service.client._telemetry import DEFAULT_TELEMETRY
        client = TokenClient.from_redis(fakeredis.FakeRedis())
        token = client.generate("job.run").token
        assert client.guard(token, "job.run").run(lambda: 1) == 1
        assert client.guard(token, "job.run").run(lambda: 2) == 1
        assert DEFAULT_TELEMETRY.start_span("job.run").current() is not None
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "ok", done.stderr


# -- the Idempotency-Key middlewares count under the same names, and trace ---------------------

KEY_HEADERS = {"Idempotency-Key": '"k-1"', "Authorization": "Bearer client-a"}


def _middleware_spans(observed: Observed) -> list[tuple[str, Any, Any]]:
    return [
        (
            span.name,
            (span.attributes or {}).get("token_service.outcome"),
            (span.attributes or {}).get("token_service.scope"),
        )
        for span in observed.exporter.get_finished_spans()
    ]


def test_the_wsgi_idempotency_key_middleware_counts_and_traces(observed: Observed, redis_client: Any) -> None:
    from flask import Flask

    from token_service.client.wsgi import IdempotencyMiddleware

    app = Flask(__name__)

    @app.post("/orders")
    def create_order() -> Any:
        return {"ok": True}, 201

    @app.post("/busy")
    def busy() -> Any:
        return {"retry": "later"}, 503

    app.wsgi_app = IdempotencyMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, redis_client, telemetry=observed.telemetry, telemetry_scope=SCOPE
    )
    http = app.test_client()
    assert http.post("/orders", json={"a": 1}, headers=KEY_HEADERS).status_code == 201
    assert http.post("/orders", json={"a": 1}, headers=KEY_HEADERS).headers["Idempotent-Replayed"] == "true"
    assert http.post("/orders", json={"a": 2}, headers=KEY_HEADERS).status_code == 422
    busy_key = {**KEY_HEADERS, "Idempotency-Key": '"k-2"'}
    assert http.post("/busy", json={}, headers=busy_key).status_code == 503
    assert observed.count("executions", outcome="succeeded") == 1
    assert observed.count("executions", outcome="released") == 1
    assert observed.count("replays") == 1
    assert observed.count("mismatches", field="fingerprint") == 1
    name = "token_service.idempotency_key"
    assert _middleware_spans(observed) == [
        (name, "executed", SCOPE),
        (name, "replayed", SCOPE),
        (name, "mismatch", SCOPE),
        (name, "released", SCOPE),
    ]


@pytest.mark.real
async def test_the_asgi_idempotency_key_middleware_counts_and_traces(
    observed: Observed, redis_server: RedisServer
) -> None:
    import redis.asyncio

    from token_service.client import asgi

    client = redis.asyncio.Redis.from_url(redis_server.url)
    await client.flushall()
    runs = 0

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal runs
        runs += 1
        await receive()
        await send(
            {"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"text/plain")]}
        )
        await send({"type": "http.response.body", "body": b"made", "more_body": False})

    middleware = asgi.IdempotencyMiddleware(app, client, telemetry=observed.telemetry, telemetry_scope=SCOPE)

    async def post(body: bytes) -> int:
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/orders",
            "query_string": b"",
            "headers": [(b"idempotency-key", b'"k-1"'), (b"authorization", b"Bearer client-a")],
        }
        statuses: list[int] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        await middleware(scope, receive, send)
        return statuses[0]

    try:
        assert [await post(b"{}"), await post(b"{}"), await post(b'{"other": 1}')] == [201, 201, 422]
    finally:
        await client.flushall()
        await client.aclose()
    assert runs == 1
    assert observed.count("executions", outcome="succeeded") == 1
    assert observed.count("replays") == 1
    assert observed.count("mismatches", field="fingerprint") == 1
    spans = observed.exporter.get_finished_spans()
    assert [(span.attributes or {}).get("token_service.outcome") for span in spans] == [
        "executed",
        "replayed",
        "mismatch",
    ]
    assert all((span.attributes or {}).get("token_service.async") is True for span in spans)
