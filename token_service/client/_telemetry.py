"""What the SDK's guards did, for dashboards and traces: Prometheus counters (only when a
registry is given) and OpenTelemetry spans (whenever ``opentelemetry-api`` is installed and an
SDK is configured); both optional, and without the packages every call here is a no-op.
The counters, spans and their labels: docs/sdk.md, "Telemetry". One :class:`Telemetry` per
client; the default one traces (when possible) and counts nothing.
"""

from __future__ import annotations

import importlib.util
from contextlib import AbstractContextManager, nullcontext
from typing import Any

__all__ = [
    "DEFAULT_TELEMETRY",
    "DURABLE_SPAN_NAME",
    "IDEMPOTENCY_SPAN_NAME",
    "SPAN_NAME",
    "GuardSpan",
    "Telemetry",
]

SPAN_NAME = "token_service.guard"
IDEMPOTENCY_SPAN_NAME = "token_service.idempotency_key"
DURABLE_SPAN_NAME = "token_service.durable"
_NAMESPACE = "token_service_sdk"


def _tracing_available() -> bool:
    try:
        return importlib.util.find_spec("opentelemetry.trace") is not None
    except (ImportError, ValueError):  # not installed, or blocked (sys.modules entry None)
        return False


class GuardSpan:
    """One guarded call's span (or nothing): outcome, current-context scope, end."""

    __slots__ = ("_span", "outcome")

    def __init__(self, span: Any) -> None:
        self._span = span
        self.outcome: str | None = None

    def set_outcome(self, outcome: str) -> None:
        self.outcome = outcome
        if self._span is not None:
            self._span.set_attribute("token_service.outcome", outcome)

    def record_error(self, exc: BaseException) -> None:
        if self._span is not None:
            from opentelemetry.trace import Status, StatusCode

            self._span.record_exception(exc)
            self._span.set_status(Status(StatusCode.ERROR, type(exc).__name__))

    def add_event(self, name: str, attributes: dict[str, Any] | None = None) -> None:
        if self._span is not None:
            self._span.add_event(name, attributes or {})

    def current(self) -> AbstractContextManager[Any]:
        """The span as the current one (the guarded work's spans nest under it)."""
        if self._span is None:
            return nullcontext()
        from opentelemetry import trace

        return trace.use_span(self._span, end_on_exit=False)

    def end(self) -> None:
        span, self._span = self._span, None
        if span is not None:
            span.end()


class Telemetry:
    """Counters and spans of the SDK's guards (see the module docs)."""

    def __init__(
        self,
        *,
        prometheus_registry: Any = None,
        tracer_provider: Any = None,
        tracing: bool = True,
    ) -> None:
        self._counters: dict[str, Any] = {}
        if prometheus_registry is not None:
            self._counters = _counters(prometheus_registry)
        self._tracer: Any = None
        if tracing and _tracing_available():
            from opentelemetry import trace

            self._tracer = trace.get_tracer("token_service.client", tracer_provider=tracer_provider)

    def count(self, name: str, scope: str, **labels: str) -> None:
        counter = self._counters.get(name)
        if counter is not None:
            counter.labels(scope=scope, **labels).inc()

    def start_span(self, scope: str, *, is_async: bool = False, name: str = SPAN_NAME) -> GuardSpan:
        if self._tracer is None:
            return GuardSpan(None)
        span = self._tracer.start_span(
            name, attributes={"token_service.scope": scope, "token_service.async": is_async}
        )
        if not span.get_span_context().is_valid:
            # No SDK configured (the API's no-op span): nothing would be recorded, and making it
            # current would only cost a context switch in and out on every call. (A span an SDK
            # sampled out has a valid context, and stays current so its children follow it.)
            return GuardSpan(None)
        return GuardSpan(span)


def _counters(registry: Any) -> dict[str, Any]:
    from prometheus_client import Counter

    def counter(name: str, documentation: str, *labels: str) -> Any:
        return Counter(f"{_NAMESPACE}_{name}", documentation, ["scope", *labels], registry=registry)

    return {
        "executions": counter("executions", "Guarded operations that ran.", "outcome"),
        "replays": counter("replays", "Duplicates answered with the stored result."),
        "conflicts": counter("conflicts", "Calls refused: in progress, used or failed.", "code"),
        "mismatches": counter("mismatches", "Calls refused: the token is bound to another request.", "field"),
        "lease_losses": counter("lease_losses", "Operations whose lease was lost while they ran."),
        "store_errors": counter(
            "store_errors", "Token service calls that could not be answered.", "operation"
        ),
    }


DEFAULT_TELEMETRY = Telemetry()
