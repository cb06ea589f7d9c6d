"""The payment API: one Flask app, one fake bank, every charge behind a one-time token."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flask import Flask, Request, abort, request

from token_service.client import TokenClient
from token_service.client.flask import require_token

SCOPE = "payment.create"
USER_HEADER = "X-User-Id"


class CardDeclined(Exception):
    """The bank refused the charge."""


@dataclass
class Bank:
    """Stands in for a payment provider: remembers every charge it made."""

    limit: int = 100_000
    charges: dict[str, dict[str, Any]] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def charge(self, user: str, amount: int, currency: str) -> dict[str, Any]:
        if amount > self.limit:
            raise CardDeclined(f"amount {amount} is over the card's limit")
        with self._lock:
            payment_id = f"pay_{next(self._ids)}"
            self.charges[payment_id] = {
                "id": payment_id,
                "user": user,
                "amount": amount,
                "currency": currency,
            }
            return self.charges[payment_id]


def token_client_from_env(environ: Mapping[str, str]) -> TokenClient:
    if environ.get("TOKEN_SERVICE_URL"):
        return TokenClient(environ["TOKEN_SERVICE_URL"], api_key=environ.get("TOKEN_SERVICE_API_KEY"))
    return TokenClient.from_redis(environ.get("TOKEN_SERVICE_REDIS_URL", "redis://localhost:6379/0"))


def current_user(req: Request) -> str:
    user = req.headers.get(USER_HEADER, "").strip()
    if not user:
        abort(401)
    return user


def create_app(tokens: TokenClient, bank: Bank | None = None) -> Flask:
    app = Flask(__name__)
    bank = bank or Bank()
    app.extensions["bank"] = bank

    @app.post("/checkout/token")
    def checkout_token() -> Any:
        issued = tokens.generate(SCOPE, subject=current_user(request), ttl_seconds=600)
        return (
            {"token": issued.token, "expires_at": issued.expires_at.isoformat()},
            201,
            {"Cache-Control": "no-store"},
        )

    @app.post("/payments")
    @require_token(tokens, SCOPE, subject=current_user, replay_headers=("Content-Type", "Location"))
    def create_payment() -> Any:
        body = request.get_json(silent=True) or {}
        amount, currency = body.get("amount"), body.get("currency", "EUR")
        if not isinstance(amount, int) or amount <= 0 or currency not in ("EUR", "USD"):
            # a 4xx is an answer too: it is stored, and the token is spent on it
            return {"error": "amount must be a positive integer (cents), currency EUR or USD"}, 400
        try:
            payment = bank.charge(current_user(request), amount, currency)
        except CardDeclined as exc:
            return {"error": "card_declined", "detail": str(exc)}, 402
        return payment, 201, {"Location": f"/payments/{payment['id']}"}

    @app.get("/payments/<payment_id>")
    def show_payment(payment_id: str) -> Any:
        payment = bank.charges.get(payment_id)
        if payment is None or payment["user"] != current_user(request):
            abort(404)
        return payment

    return app
