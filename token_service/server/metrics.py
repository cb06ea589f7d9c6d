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

from token_service import defaults, records
from token_service.config import MAX_METRIC_SCOPES
from token_service.errors import OutstandingCapReached, RateLimited, TokenError
from token_service.limits import IssuanceLimits
from token_service.server import request_context
from token_service.server.metric_files import OTHER_SCOPE, multiprocess_dir, reading, scope_labels
from token_service.store import IssueRequest, TokenStore
from token_service.tokens import digest_key, token_digest

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


def note_token(token: str, digest: str | None = None) -> None:
    """Remember a short digest prefix of the request's token for the access log."""
    request_context.note_token_ref((digest or token_digest(token))[:TOKEN_REF_CHARS])


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


class MeteredStore(TokenStore):
    """The store, counting what each operation did. It adds no Redis calls."""

    def __init__(self, client: Any, *, metric_scopes: tuple[str, ...] = (), **options: Any) -> None:
        super().__init__(client, **options)
        self.scopes = scope_labels(MAX_SCOPES, metric_scopes)
        self._zeroed: set[str] = set()  # scope labels whose use outcomes exist (at 0 or more)
        for scope in metric_scopes:
            self._label(scope)  # the configured scopes' outcomes, at 0 from the first scrape
        # the last token noted and its key: the store's key() reuses the digest just made
        self._noted: tuple[str | None, str] = (None, "")

    def _note(self, token: str) -> None:
        digest = token_digest(token)
        self._noted = (token, digest_key(self.key_prefix, digest))  # one tuple: thread-safe
        note_token(token, digest)

    def key(self, token: str) -> str:
        noted = self._noted
        return noted[1] if noted[0] is token else super().key(token)

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
        _outcomes(operation, code, self._label(scope) if scope else NO_SCOPE).inc()

    def _measured(self, operation: str, scope: str | None, call: Any) -> Any:
        try:
            result = call()
        except TokenError as error:
            self._outcome(operation, error.code, scope)
            raise
        return result

    def admit(self, client_key: str, limits: IssuanceLimits, count: int, ttl_seconds: int) -> str:
        try:
            return super().admit(client_key, limits, count, ttl_seconds)
        except RateLimited as refused:
            RATE_LIMITED.labels("outstanding" if isinstance(refused, OutstandingCapReached) else "rate").inc()
            raise

    def issue(self, request: IssueRequest, count: int = 1) -> list[str]:
        tokens = super().issue(request, count)
        # generate needs no key: its scope gets no label of its own (the configured ones,
        # or a backend's consume or begin, give it one)
        _issued(self._label(request.scope, admit=False)).inc(len(tokens))
        return tokens

    def admit_and_issue(
        self, client_key: str, limits: IssuanceLimits, request: IssueRequest, count: int = 1
    ) -> list[str]:
        if self._cluster:  # two calls, admit and issue above: each counts itself
            return super().admit_and_issue(client_key, limits, request, count)
        try:
            tokens = super().admit_and_issue(client_key, limits, request, count)
        except RateLimited as refused:
            RATE_LIMITED.labels("outstanding" if isinstance(refused, OutstandingCapReached) else "rate").inc()
            raise
        _issued(self._label(request.scope, admit=False)).inc(len(tokens))
        return tokens

    def consume(
        self,
        token: str,
        scope: str,
        subject: str | None = None,
        fingerprint: str | None = None,
        request_id: str | None = None,
    ) -> records.Consumed:
        self._note(token)
        outcome: records.Consumed = self._measured(
            "consume",
            scope,
            lambda: super(MeteredStore, self).consume(token, scope, subject, fingerprint, request_id),
        )
        self._outcome("consume", "consumed", scope)
        if outcome.replayed:
            _replays("consume").inc()
        return outcome

    def begin(
        self,
        token: str,
        scope: str,
        subject: str | None = None,
        fingerprint: str | None = None,
        request_id: str | None = None,
        lease_seconds: int = defaults.DEFAULT_LEASE_SECONDS,
    ) -> records.Started | records.Finished:
        self._note(token)
        outcome: records.Started | records.Finished = self._measured(
            "begin",
            scope,
            lambda: super(MeteredStore, self).begin(
                token, scope, subject, fingerprint, request_id, lease_seconds
            ),
        )
        if isinstance(outcome, records.Finished):
            self._outcome("begin", "succeeded", scope)
            _replays("begin").inc()
        else:
            self._outcome("begin", "started", scope)
            if outcome.replayed:
                _replays("begin").inc()
        return outcome

    def renew(
        self, token: str, lease_id: str, lease_seconds: int = defaults.DEFAULT_LEASE_SECONDS
    ) -> records.Renewed:
        self._note(token)
        outcome: records.Renewed = self._measured(
            "renew", None, lambda: super(MeteredStore, self).renew(token, lease_id, lease_seconds)
        )
        self._outcome("renew", "renewed", None)
        return outcome

    def complete(self, token: str, lease_id: str, result: Any) -> records.Completed:
        self._note(token)
        outcome: records.Completed = self._measured(
            "complete", None, lambda: super(MeteredStore, self).complete(token, lease_id, result)
        )
        self._outcome("complete", "succeeded", None)
        if outcome.replayed:
            _replays("complete").inc()
        return outcome

    def fail(self, token: str, lease_id: str, *, retryable: bool, error: Any = None) -> records.FailRecorded:
        self._note(token)
        outcome: records.FailRecorded = self._measured(
            "fail",
            None,
            lambda: super(MeteredStore, self).fail(token, lease_id, retryable=retryable, error=error),
        )
        self._outcome("fail", outcome.outcome, None)
        if outcome.replayed:
            _replays("fail").inc()
        return outcome

    def inspect(self, token: str) -> records.Inspection:
        self._note(token)
        return self._measured("inspect", None, lambda: super(MeteredStore, self).inspect(token))  # type: ignore[no-any-return]

    def revoke(self, token: str) -> None:
        self._note(token)
        self._measured("revoke", None, lambda: super(MeteredStore, self).revoke(token))
        self._outcome("revoke", "revoked", None)


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
    (``MeteredStore._label``): at start for the configured scopes, else at the first
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
