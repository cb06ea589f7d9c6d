"""The HTTP API (openapi.yaml): one blueprint, one view per route of ``routes.TOKEN_ROUTES``.

Views parse and validate the body, call the store, and shape the reply; they
hold no token logic of their own (that lives in ``lua/``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from flask import Blueprint, Response, request

from token_service import records
from token_service.config import Settings
from token_service.errors import InvalidRequest
from token_service.server.auth import check_service_key
from token_service.server.operations import (
    HotOperations,
    parse_json_object,
    rfc3339,
)
from token_service.server.operations import load_body as _load
from token_service.server.operations import well_formed_token as _token
from token_service.server.responses import json_response, json_text_response
from token_service.server.routes import TOKEN_ROUTES, Route
from token_service.server.schemas import (
    BeginSchema,
    CompleteSchema,
    FailSchema,
    GenerateBatchSchema,
    RenewSchema,
    TokenOnlySchema,
)
from token_service.store import TokenStore

__all__ = ["Reply", "json_body", "make_blueprint"]


def json_body() -> dict[str, Any]:
    if not request.is_json:
        raise InvalidRequest(
            "The body must be JSON (Content-Type: application/json).", {"body": ["Not JSON."]}
        )
    return parse_json_object(request.get_data(cache=False))  # get_data raises 413 past MAX_CONTENT_LENGTH


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
        outcome = store.begin(hot.use_request(data), data["lease_seconds"] or settings.default_lease_seconds)
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
