"""TEMPORARY: a guard on TokenStore begin/complete until the SDK's require_token is on main."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from flask import Response, make_response, request

from token_service import records
from token_service.errors import InvalidRequest
from token_service.store import TokenStore


def store_guard(store: TokenStore, scope: str, header: str = "Idempotency-Token") -> Callable[..., Any]:
    def decorate(view: Callable[..., Any]) -> Callable[..., Response]:
        @functools.wraps(view)
        def guarded(*args: Any, **kwargs: Any) -> Response:
            token = request.headers.get(header, "")
            if not token:
                raise InvalidRequest(f"The {header} header is required.", {header: ["Missing."]})
            outcome = store.begin(token, scope, lease_seconds=10)
            if isinstance(outcome, records.Finished):
                replay = Response(
                    outcome.result["b"], status=outcome.result["s"], mimetype="application/json"
                )
                replay.headers["Idempotent-Replayed"] = "true"
                return replay
            try:
                response = make_response(view(*args, **kwargs))
            except Exception:
                store.fail(token, outcome.lease_id, retryable=True)
                raise
            if response.status_code >= 500:
                store.fail(token, outcome.lease_id, retryable=True)
            else:
                store.complete(
                    token, outcome.lease_id, {"s": response.status_code, "b": response.get_data(True)}
                )
            return response

        return guarded

    return decorate


__all__ = ["store_guard"]
