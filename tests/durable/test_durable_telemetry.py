"""The durable backstop's telemetry: ``run_once(..., telemetry=)`` counts under the SDK's counters and
traces a ``token_service.durable`` span (current while the handler runs), on SQLite, PostgreSQL and
MariaDB; without ``telemetry=`` it still traces on the default (no counters)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from tests.durable.databases import Db
from token_service.client import Telemetry
from token_service.client.durable import (
    FingerprintMismatch,
    RecordFailed,
    StoredResponse,
    claim,
    fail,
    request_fingerprint,
    run_once,
)
from token_service.errors import LeaseLost

SCOPE = "payment.durable"


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


@pytest.fixture
def observed() -> Iterator[Observed]:
    found = Observed()
    yield found
    found.provider.shutdown()


def test_run_once_counts_and_traces_each_outcome(db: Db, observed: Observed) -> None:
    tracer = observed.provider.get_tracer("test")

    def handler(conn: sa.Connection) -> StoredResponse:
        with tracer.start_as_current_span("charge"):
            conn.execute(sa.insert(db.payments).values(order_id="o-1", amount_cents=100, executed_by="t"))
        return StoredResponse.json(201, {"charged": True})

    def broken(conn: sa.Connection) -> StoredResponse:
        raise RuntimeError("the bank timed out")

    options: dict[str, Any] = {"table": db.records, "telemetry": observed.telemetry, "telemetry_scope": SCOPE}
    paid = request_fingerprint({"amount": 100})
    for _ in range(2):
        with db.engine.begin() as conn:
            run_once(conn, "pay-1", handler, fingerprint=paid, **options)
    with pytest.raises(FingerprintMismatch), db.engine.begin() as conn:
        run_once(conn, "pay-1", handler, fingerprint=request_fingerprint({"amount": 999}), **options)
    with pytest.raises(RuntimeError), db.engine.begin() as conn:
        run_once(conn, "pay-2", broken, **options)

    assert observed.count("executions", outcome="succeeded") == 1
    assert observed.count("executions", outcome="released") == 1
    assert observed.count("replays") == 1
    assert observed.count("mismatches", field="fingerprint") == 1
    spans = observed.exporter.get_finished_spans()
    durable = [span for span in spans if span.name == "token_service.durable"]
    assert [(span.attributes or {}).get("token_service.outcome") for span in durable] == [
        "executed",
        "replayed",
        "mismatch",
        "released",
    ]
    (charge,) = [span for span in spans if span.name == "charge"]
    assert charge.parent is not None
    assert charge.parent.span_id == durable[0].context.span_id  # the handler's spans nest under it
    assert durable[-1].events[0].name == "exception"


def test_a_conflict_and_a_lost_lease_are_counted_and_traced_as_a_guards_are(
    db: Db, observed: Observed, caplog: pytest.LogCaptureFixture
) -> None:
    options: dict[str, Any] = {"table": db.records, "telemetry": observed.telemetry, "telemetry_scope": SCOPE}
    with db.engine.begin() as conn:
        fail(
            conn,
            claim(conn, "pay-3", table=db.records),
            retryable=False,
            error={"declined": True},
            table=db.records,
        )

    def taken_over(conn: sa.Connection) -> StoredResponse:
        # another request took the claim over while this one ran: its complete is fenced out
        conn.execute(
            sa.update(db.records).where(db.records.c.record_key == "pay-4").values(lease_id="theirs")
        )
        return StoredResponse.json(201, {"charged": True})

    with pytest.raises(RecordFailed), db.engine.begin() as conn:
        run_once(conn, "pay-3", taken_over, **options)
    with pytest.raises(LeaseLost), db.engine.begin() as conn:
        run_once(conn, "pay-4", taken_over, **options)

    assert observed.count("conflicts", code="record_failed") == 1
    assert observed.count("lease_losses") == 1
    assert observed.count("executions", outcome="lease_lost") == 1
    durable = [
        span for span in observed.exporter.get_finished_spans() if span.name == "token_service.durable"
    ]
    assert [(span.attributes or {}).get("token_service.outcome") for span in durable] == [
        "conflict",
        "lease_lost",
    ]
    assert [event.name for event in durable[-1].events] == ["lease_lost", "exception"]
    assert [record.levelname for record in caplog.records if "lost its lease" in record.getMessage()] == [
        "ERROR"
    ]
