"""The shop: a checkout page and a charges API whose POST is guarded by a token.

The guard (the SDK's ``require_token`` in the demo) begins the token before
the view runs, stores the view's response when it finishes, and answers every
duplicate — a double click, a retry after a lost reply, a second tab of the
same action — with that stored response, marked ``Idempotent-Replayed: true``.
So ``charge()`` below is written as if it ran once, because it does.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flask import Flask, Response, jsonify, render_template, request

from token_service.errors import InvalidRequest
from token_service.server.responses import register_error_handlers

View = Callable[..., Any]
SCOPE = "payment.create"
HERE = Path(__file__).resolve().parent
CURRENCIES = ("EUR", "USD", "GBP")


class Ledger:
    """Charges in memory; a lock because the dev server runs views in threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._charges: list[dict[str, Any]] = []

    def record(self, amount_cents: int, currency: str, item: str) -> dict[str, Any]:
        with self._lock:
            charge = {
                "id": f"ch_{next(self._ids):04d}",
                "amount_cents": amount_cents,
                "currency": currency,
                "item": item,
                "created_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            }
            self._charges.append(charge)
            return dict(charge)

    def all(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(charge) for charge in self._charges]


def _charge_request() -> tuple[int, str, str]:
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise InvalidRequest("The body must be a JSON object.", {"body": ["Not a JSON object."]})
    errors: dict[str, list[str]] = {}
    amount = body.get("amount_cents")
    if not isinstance(amount, int) or isinstance(amount, bool) or not 1 <= amount <= 1_000_000:
        errors["amount_cents"] = ["An integer from 1 to 1000000."]
    currency = body.get("currency")
    if currency not in CURRENCIES:
        errors["currency"] = [f"One of {', '.join(CURRENCIES)}."]
    item = body.get("item")
    if not isinstance(item, str) or not 1 <= len(item) <= 100:
        errors["item"] = ["A string of 1 to 100 characters."]
    unknown = set(body) - {"amount_cents", "currency", "item"}
    for name in unknown:
        errors[name] = ["Unknown field."]
    if errors:
        raise InvalidRequest("The charge request is invalid.", errors)
    return amount, currency, item


def create_shop(
    guard: Callable[[View], View],
    token_service_url: str,
    *,
    charge_delay_seconds: float = 0.0,
    ledger: Ledger | None = None,
) -> Flask:
    """The shop app. ``guard`` protects the charge view (e.g. ``require_token(client, scope=SCOPE)``);
    ``charge_delay_seconds`` stands for a slow payment provider, so a double
    click really overlaps the first charge."""
    app = Flask(__name__, root_path=str(HERE))
    app.extensions["ledger"] = ledger = ledger or Ledger()
    register_error_handlers(app)
    module_url = token_service_url.rstrip("/") + "/static/token-client.js"

    @app.get("/")
    def page() -> str:
        return render_template("checkout.html", token_client_url=module_url, scope=SCOPE)

    @app.post("/api/charges")
    @guard
    def charge() -> tuple[Response, int]:
        amount, currency, item = _charge_request()
        time.sleep(charge_delay_seconds)  # the payment provider at work
        return jsonify(charge=ledger.record(amount, currency, item)), 201

    @app.get("/api/charges")
    def charges() -> Response:
        response = jsonify(charges=ledger.all())
        response.headers["Cache-Control"] = "no-store"
        return response

    @app.get("/healthz")
    def healthz() -> Response:
        return jsonify(status="ok")

    return app
