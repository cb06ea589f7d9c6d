"""The HTTP API (openapi.yaml): one blueprint, one view per route of ``routes.TOKEN_ROUTES``.

Views parse and validate the body, call the store, and shape the reply; they
hold no token logic of their own (that lives in ``lua/``).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, NoReturn

from flask import Blueprint, Response, request
from marshmallow import Schema, ValidationError

from token_service import records
from token_service.config import Settings
from token_service.errors import InvalidRequest, TokenInvalid
from token_service.limits import IssuanceLimits, client_key
from token_service.server.auth import check_service_key
from token_service.server.responses import json_response, json_text_response
from token_service.server.routes import TOKEN_ROUTES, Route
from token_service.server.schemas import (
    BeginSchema,
    BodySchema,
    CompleteSchema,
    ConsumeSchema,
    FailSchema,
    GenerateBatchSchema,
    GenerateSchema,
    RenewSchema,
    TokenOnlySchema,
)
from token_service.store import IssueRequest, TokenStore
from token_service.tokens import NO_CONTROL_RE, is_well_formed


def rfc3339(epoch_seconds: float) -> str:
    return datetime.fromtimestamp(epoch_seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def json_body() -> dict[str, Any]:
    if not request.is_json:
        raise InvalidRequest(
            "The body must be JSON (Content-Type: application/json).", {"body": ["Not JSON."]}
        )
    return parse_json_object(request.get_data(cache=False))  # get_data raises 413 past MAX_CONTENT_LENGTH


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be one JSON object (any UTF encoding), or InvalidRequest."""
    try:
        # json.loads(raw, parse_constant=..., parse_float=...) without a new decoder per request
        body = _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequest("The body is not valid JSON.", {"body": ["Malformed JSON."]}) from None
    except RecursionError:  # [[[[...: nested deeper than Python's parser goes, within the size limit
        raise InvalidRequest("The body is nested too deeply.", {"body": ["Nested too deeply."]}) from None
    if not isinstance(body, dict):
        raise InvalidRequest("The body must be a JSON object.", {"body": ["Not an object."]})
    return body


def _reject_constant(name: str) -> Any:
    # NaN and Infinity are not JSON: stored, they would make later replies invalid JSON
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400 is valid JSON but no float: refuse rather than store Infinity
        raise ValueError("number out of range")
    return value


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


def raise_request_id_required() -> NoReturn:
    """TOKEN_SERVICE_REQUIRE_REQUEST_ID: a consume or begin that could not be retried safely."""
    raise InvalidRequest(
        "A request_id is required: without one, a retry after a lost reply cannot tell a win from a loss.",
        {"request_id": ["Required (TOKEN_SERVICE_REQUIRE_REQUEST_ID is on); reuse it when you retry."]},
    )


def _load(schema: Schema, body: dict[str, Any]) -> dict[str, Any]:
    fast = schema.fast_load(body) if isinstance(schema, BodySchema) else None
    if fast is not None:
        return fast
    try:
        return schema.load(body)  # type: ignore[no-any-return]
    except ValidationError as exc:
        errors = exc.messages if isinstance(exc.messages, dict) else {"body": exc.messages}
        raise InvalidRequest("The request does not match the schema.", errors) from None


def _gateway_subject(header: str, value: str | None) -> str | None:
    """The subject the gateway vouches for; held to the body's rules (it lands in the record)."""
    subject = value or None
    if subject is not None and (len(subject) > 128 or not NO_CONTROL_RE.match(subject)):
        raise InvalidRequest(
            f"The {header} header is not a valid subject.",
            {header: ["1-128 characters, no control characters."]},
        )
    return subject


def _token(data: dict[str, Any]) -> str:
    token: str = data["token"]
    if not is_well_formed(token):
        raise TokenInvalid("The token is unknown, expired or revoked.")
    return token


class HotOperations:
    """The work of the two hottest routes, from a parsed body to the reply document, without Flask.

    The Flask views below and :mod:`token_service.server.hot_path` (which answers
    these routes without Flask's request machinery) both call these, so the
    two paths cannot drift apart in what they check, store or answer.
    """

    def __init__(self, settings: Settings, store: TokenStore) -> None:
        self.settings = settings
        self.store = store
        self.ttl_limits = {"ttl_seconds": (1, settings.max_ttl_seconds)}
        self.generate_schema = GenerateSchema(limits=self.ttl_limits)
        self.consume_schema = ConsumeSchema()
        self.limits = IssuanceLimits(settings.rate_limit, settings.max_outstanding_per_subject)

    def issue(
        self, data: dict[str, Any], count: int, gateway_subject: str | None, remote_addr: str | None
    ) -> tuple[list[str], dict[str, Any]]:
        """The tokens, and the fields every one of them shares in the reply.

        ``gateway_subject`` is the value of the configured subject header (if
        any), ``remote_addr`` the client's address (after any trusted proxies).
        """
        settings = self.settings
        subject = data["subject"]
        if settings.subject_header:
            # Only a trusted gateway may say whose token it is.
            if subject is not None:
                raise InvalidRequest(
                    "The subject is set by the gateway, not the body.",
                    {"subject": [f"Not allowed: the subject comes from {settings.subject_header}."]},
                )
            subject = _gateway_subject(settings.subject_header, gateway_subject)
        ttl_seconds = data["ttl_seconds"] or settings.default_ttl_seconds
        issue_request = IssueRequest(data["scope"], subject, data["fingerprint"], ttl_seconds)
        if self.limits.enabled:
            # The trusted subject if the gateway set one, else the client address:
            # a body subject is the client's own claim and names nobody.
            trusted = settings.subject_header and subject is not None
            identity = f"subject:{subject}" if trusted else f"addr:{remote_addr}"
            key = client_key(settings.key_prefix, identity)
            tokens = self.store.admit_and_issue(key, self.limits, issue_request, count)
        else:
            tokens = self.store.issue(issue_request, count)
        shared = {
            "scope": issue_request.scope,
            "subject": subject,
            "fingerprint": issue_request.fingerprint,
            "ttl_seconds": ttl_seconds,
            "expires_at": rfc3339(time.time() + ttl_seconds),
        }
        return tokens, shared

    def generate(
        self, body: dict[str, Any], gateway_subject: str | None, remote_addr: str | None
    ) -> dict[str, Any]:
        tokens, shared = self.issue(_load(self.generate_schema, body), 1, gateway_subject, remote_addr)
        return {"token": tokens[0], **shared}

    def consume(self, body: dict[str, Any]) -> dict[str, Any]:
        data = _load(self.consume_schema, body)
        if data["request_id"] is None and self.settings.require_request_id:
            raise_request_id_required()
        outcome = self.store.consume(
            _token(data), data["scope"], data["subject"], data["fingerprint"], data["request_id"]
        )
        return {"outcome": "consumed", "replayed": outcome.replayed}


def make_blueprint(settings: Settings, store: TokenStore, hot: HotOperations) -> Blueprint:
    """One view per route of ``routes.TOKEN_ROUTES``: its path, method, success status and key check."""
    bp = Blueprint("tokens", __name__)
    batch_schema = GenerateBatchSchema(limits=hot.ttl_limits)
    begin_schema = BeginSchema(limits={"lease_seconds": (1, settings.max_lease_seconds)})
    renew_schema = RenewSchema(limits={"lease_seconds": (1, settings.max_lease_seconds)})
    complete_schema = CompleteSchema()
    fail_schema = FailSchema()
    token_schema = TokenOnlySchema()
    subject_header = settings.subject_header

    def gateway_subject() -> str | None:
        return request.headers.get(subject_header) if subject_header else None

    def generate() -> Reply:
        return hot.generate(json_body(), gateway_subject(), request.remote_addr)

    def generate_batch() -> Reply:
        data = _load(batch_schema, json_body())
        tokens, shared = hot.issue(data, data["count"], gateway_subject(), request.remote_addr)
        # {"tokens": [{"token": t, **shared}, ...]} as json.dumps writes it, with the shared
        # fields serialised once instead of once per token (a tenth of a 1000-token reply's
        # CPU). Tokens are URL-safe base64: nothing in them needs escaping in JSON.
        tail = json.dumps(shared, separators=(",", ":"))[1:]
        elements = ",".join(f'{{"token":"{token}",{tail}' for token in tokens)
        return f'{{"tokens":[{elements}]}}'

    def consume() -> Reply:
        return hot.consume(json_body())

    def begin() -> Reply:
        data = _load(begin_schema, json_body())
        if data["request_id"] is None and settings.require_request_id:
            raise_request_id_required()
        outcome = store.begin(
            _token(data),
            data["scope"],
            data["subject"],
            data["fingerprint"],
            data["request_id"],
            data["lease_seconds"] or settings.default_lease_seconds,
        )
        if isinstance(outcome, records.Finished):
            return {"outcome": "succeeded", "replayed": True, "result": outcome.result}
        return {
            "outcome": "started",
            "lease_id": outcome.lease_id,
            "lease_expires_at": rfc3339(outcome.lease_expires_ms / 1000),
            # the lease as a duration: a client compares it with its own monotonic clock,
            # never lease_expires_at (Redis's clock) with its own wall clock
            "lease_seconds": outcome.lease_seconds,
            "replayed": outcome.replayed,
        }

    def renew() -> Reply:
        data = _load(renew_schema, json_body())
        outcome = store.renew(
            _token(data), data["lease_id"], data["lease_seconds"] or settings.default_lease_seconds
        )
        return {
            "outcome": "renewed",
            "lease_expires_at": rfc3339(outcome.lease_expires_ms / 1000),
            "lease_seconds": outcome.lease_seconds,
        }

    def complete() -> Reply:
        data = _load(complete_schema, json_body())
        records.check_payload("result", data["result"], settings.max_result_bytes)
        outcome = store.complete(_token(data), data["lease_id"], data["result"])
        return {"outcome": "succeeded", "replayed": outcome.replayed}

    def fail() -> Reply:
        data = _load(fail_schema, json_body())
        records.check_payload("error", data["error"], settings.max_result_bytes)
        outcome = store.fail(_token(data), data["lease_id"], retryable=data["retryable"], error=data["error"])
        return {"outcome": outcome.outcome, "replayed": outcome.replayed}

    def inspect() -> Reply:
        data = _load(token_schema, json_body())
        found = store.inspect(_token(data))
        body: dict[str, Any] = {
            "state": found.state,
            "scope": found.scope,
            "subject": found.subject,
            "fingerprint": found.fingerprint,
            "expires_at": rfc3339(time.time() + found.record_ttl_ms / 1000),
        }
        if found.lease_expires_ms is not None:
            body["lease_expires_at"] = rfc3339(found.lease_expires_ms / 1000)
        if found.state == "SUCCEEDED":
            body["result"] = found.result
        elif found.state == "FAILED":
            body["error"] = found.error
        return body

    def revoke() -> Reply:
        data = _load(token_schema, json_body())
        store.revoke(_token(data))
        return {"outcome": "revoked"}

    views: dict[str, Callable[[], Reply]] = {
        "generate": generate,
        "generate_batch": generate_batch,
        "consume": consume,
        "begin": begin,
        "renew": renew,
        "complete": complete,
        "fail": fail,
        "inspect": inspect,
        "revoke": revoke,
    }
    for route in TOKEN_ROUTES:
        bp.add_url_rule(
            route.path,
            route.endpoint,
            _answer(route, views[route.endpoint], settings),
            methods=[route.method],
        )
    return bp


# A view's reply: the document, or the document already serialised as JSON text.
Reply = dict[str, Any] | str


def _answer(route: Route, view: Callable[[], Reply], settings: Settings) -> Callable[[], Response]:
    """The view as Flask calls it: the key checked if the route needs one, the reply with its status."""

    def answer() -> Response:
        if route.needs_key:
            check_service_key(settings.api_keys, request.headers.get("Authorization"))
        reply = view()
        if isinstance(reply, str):
            return json_text_response(reply, route.status)
        return json_response(reply, route.status)

    answer.__name__ = route.endpoint
    return answer
