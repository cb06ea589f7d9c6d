"""Prometheus metrics, correct under several gunicorn workers.

Under gunicorn, ``token_service.server.gunicorn_conf`` points
``PROMETHEUS_MULTIPROC_DIR`` at a fresh directory before any worker imports
prometheus_client: each worker then keeps its samples in memory-mapped files
there (an increment is a write to mapped memory, no system call), and
``GET /metrics`` adds up every worker's files, those of workers that died
included, so a count survives a worker restart. Without that variable (tests,
``flask run``) the metrics live in this process's default registry.

Label values are bounded: routes are the app's URL rules (``unmatched`` for
anything else), codes are the API's error codes, and scopes are kept for at
most :data:`MAX_SCOPES` distinct values per instance (all its workers, past and
present), counted as ``_other`` after that. Those values are chosen by the
operator (``TOKEN_SERVICE_METRIC_SCOPES``, admitted first) and by authenticated
calls (consume and begin need a service key), never by an anonymous one:
generate counts a scope under its own label only once it has one, so 60
unauthenticated generates with made-up scopes cannot push the real ones out;
see :mod:`token_service.server.metric_files`.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from flask import Blueprint, Flask, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)

from token_service import records
from token_service.config import MAX_METRIC_SCOPES
from token_service.errors import OutstandingCapReached, RateLimited, TokenError
from token_service.scripts import ADMIT_ISSUE
from token_service.server import request_context
from token_service.server.metric_files import OTHER_SCOPE, multiprocess_dir, reading, scope_labels

__all__ = [
    "LATENCY",
    "LIMITS",
    "MAX_SCOPES",
    "NO_SCOPE",
    "OUTCOMES",
    "OUTCOME_CODES",
    "RATE_LIMITED",
    "REDIS_ERRORS",
    "REPLAYED_OPERATIONS",
    "REPLAYS",
    "REQUESTS",
    "SCOPED_OPERATIONS",
    "TOKENS_ISSUED",
    "TOKEN_REF_CHARS",
    "StoreMetrics",
    "make_blueprint",
    "zero_series",
]

MAX_SCOPES = MAX_METRIC_SCOPES
# The whole digest: it is the record key's last part (<prefix>t:<token_ref>), so an operator
# finds the record with one GET (token-service admin show <token_ref>). It reveals nothing:
# the token behind it has 256 random bits.
TOKEN_REF_CHARS = 22

TOKENS_ISSUED = Counter("token_service_tokens_issued", "Tokens issued.", ["scope"])
OUTCOMES = Counter(
    "token_service_token_outcomes",
    "Outcomes of token operations: the success outcome or the error code.",
    ["operation", "code", "scope"],
)
REPLAYS = Counter(
    "token_service_replays", "Answers given again to a retry or a duplicate (replayed: true).", ["operation"]
)
RATE_LIMITED = Counter("token_service_rate_limited", "Issuance requests refused by a limit.", ["limit"])
REDIS_ERRORS = Counter(
    "token_service_redis_errors", "Requests answered 503 because Redis was unavailable.", ["route"]
)
REQUESTS = Counter("token_service_http_requests", "HTTP requests answered.", ["method", "route", "status"])
LATENCY = Histogram(
    "token_service_http_request_duration_seconds",
    "Time from the request reaching the app to its response.",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)


# Labelled children, looked up once: every label value here is bounded (operations,
# the API's error codes, scopes through metric_files.scope_labels), so are these caches.
@cache
def _outcomes(operation: str, code: str, scope: str) -> Any:
    return OUTCOMES.labels(operation, code, scope)


@cache
def _issued(scope: str) -> Any:
    return TOKENS_ISSUED.labels(scope)


@cache
def _replays(operation: str) -> Any:
    return REPLAYS.labels(operation)


class StoreMetrics:
    """The store's observer (``TokenStore(observer=...)``): counts what each operation did and
    names its token in the access log. It adds no Redis calls."""

    def __init__(self, metric_scopes: tuple[str, ...] = ()) -> None:
        self.scopes = scope_labels(MAX_SCOPES, metric_scopes)
        self._zeroed: set[str] = set()  # scope labels whose use outcomes exist (at 0 or more)
        # (operation, code, scope) -> its outcome counter, for scopes whose label is theirs for good
        self._counted: dict[tuple[str, str, str | None], Any] = {}
        for scope in metric_scopes:
            self._label(scope)  # the configured scopes' outcomes, at 0 from the first scrape

    def __call__(self, operation: str, scope: str | None, digest: str | None, outcome: Any) -> None:
        if digest is not None:
            # the access log's token_ref: the digest the store made for the record key
            request_context.note_token_ref(digest[:TOKEN_REF_CHARS])
        if operation in _ISSUING:
            if isinstance(outcome, list):
                # generate needs no key: its scope gets no label of its own (the configured
                # ones, or a backend's consume or begin, give it one)
                _issued(self._label(scope or "", admit=False)).inc(len(outcome))
            elif isinstance(outcome, RateLimited):
                RATE_LIMITED.labels(
                    "outstanding" if isinstance(outcome, OutstandingCapReached) else "rate"
                ).inc()
        elif isinstance(outcome, BaseException):
            if isinstance(outcome, TokenError):
                self._outcome(operation, outcome.code, scope)
        else:
            code, replayed = _success(outcome)
            if code is not None:
                self._outcome(operation, code, scope)
            if replayed:
                _replays(operation).inc()

    def _label(self, scope: str, *, admit: bool = True) -> str:
        """The scope's label value; ``admit=False`` (an anonymous caller's scope) takes only a label
        the scope already has. The first time this process meets a label, every consume and begin
        outcome of that scope is created at 0: a series born at 1 is one whose first increment
        Prometheus never sees (rate() starts from its first sample), so without this a scope's
        first duplicate went uncounted by the duplicate-spike alert."""
        label = self.scopes(scope) if admit else self.scopes.known(scope)
        if label not in self._zeroed:
            for operation in SCOPED_OPERATIONS:
                for code in OUTCOME_CODES[operation]:
                    _outcomes(operation, code, label)
            self._zeroed.add(label)
        return label

    def _outcome(self, operation: str, code: str, scope: str | None) -> None:
        key = (operation, code, scope)
        child = self._counted.get(key)
        if child is None:
            label = self._label(scope) if scope else NO_SCOPE
            child = _outcomes(operation, code, label)
            # a scope with a label of its own keeps it (scope_labels only ever adds): its counter
            # is looked up once, not through the label rules on every consume
            if label == scope or not scope:
                self._counted[key] = child
        child.inc()


# the operations that issue tokens: they count tokens issued and refusals by a limit
_ISSUING = frozenset({"issue", "admit", ADMIT_ISSUE})


def _success(outcome: Any) -> tuple[str | None, bool]:
    """A per-token operation's success outcome as counted (None: not counted), and whether it
    was an answer given again. The outcome's type says which operation it is."""
    match outcome:
        case records.Consumed(replayed=replayed):
            return "consumed", replayed
        case records.Started(replayed=replayed):
            return "started", replayed
        case records.Finished():  # a begin that found the stored result
            return "succeeded", True
        case records.Completed(replayed=replayed):
            return "succeeded", replayed
        case records.FailRecorded(outcome=code, replayed=replayed):
            return code, replayed
        case records.Renewed():
            return "renewed", False
        case None:  # revoke
            return "revoked", False
    return None, False  # inspect: its reads are not counted, only its errors


def _registry() -> CollectorRegistry:
    if multiprocess_dir() is None:
        return REGISTRY
    from prometheus_client import multiprocess

    # A fresh registry per scrape: the collector reads every worker's files.
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return registry


def make_blueprint() -> Blueprint:
    bp = Blueprint("metrics", __name__)

    @bp.get("/metrics")
    def metrics() -> Response:
        with reading(multiprocess_dir()):
            body = generate_latest(_registry())
        return Response(body, headers={"Content-Type": CONTENT_TYPE_LATEST, "Cache-Control": "no-store"})

    return bp


# What each operation can end in: its success outcomes, then the error codes its store call raises.
_ERRORS = ("invalid_request", "token_invalid", "lease_lost", "store_unavailable")
_USE_ERRORS = ("invalid_request", "token_invalid", "token_mismatch", "token_used", "token_in_progress")
OUTCOME_CODES: dict[str, tuple[str, ...]] = {
    "consume": ("consumed", *_USE_ERRORS, "token_failed", "store_unavailable"),
    "begin": ("started", "succeeded", *_USE_ERRORS, "token_failed", "store_unavailable"),
    "renew": ("renewed", *_ERRORS),
    "complete": ("succeeded", *_ERRORS),
    "fail": ("released", "failed", *_ERRORS),
    "inspect": ("token_invalid", "store_unavailable"),
    "revoke": ("revoked", "token_invalid", "store_unavailable"),
}
# the operations whose outcomes carry the request's scope
SCOPED_OPERATIONS = ("consume", "begin")
REPLAYED_OPERATIONS = ("consume", "begin", "complete", "fail")
LIMITS = ("rate", "outstanding")
NO_SCOPE = ""


def zero_series(app: Flask) -> None:
    """Create every bounded series at 0, so /metrics shows them all from the first scrape.

    Alerts and dashboards then read a 0 (not "no data") before the first event,
    and ``rate``/``increase`` count that first event. Scopes not configured cannot be
    listed ahead: the outcomes' scope-less series (scope ``""``, as the operations that
    carry no scope have) and the issued counter's ``_other`` stand in, and a scope's
    consume and begin outcomes are created at 0 when it gets its label
    (``StoreMetrics._label``): at start for the configured scopes, else at the first
    consume or begin naming it.
    """
    for operation, codes in OUTCOME_CODES.items():
        for code in codes:
            _outcomes(operation, code, NO_SCOPE)
    for operation in REPLAYED_OPERATIONS:
        _replays(operation)
    for limit in LIMITS:
        RATE_LIMITED.labels(limit)
    _issued(OTHER_SCOPE)  # scopes are the clients' own: the overflow series stands for them
    for rule in app.url_map.iter_rules():
        REDIS_ERRORS.labels(rule.rule)
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            LATENCY.labels(method, rule.rule)
            statuses = ("200", "503") if rule.rule == "/readyz" else ("200",)
            for status in statuses:
                REQUESTS.labels(method, rule.rule, status)
