"""The shop: orders, a checkout page, and a charge endpoint that can run once per order.

Two lines of defence, each with its own key:

- the token (``@require_token``): bound to the shopper (subject) and the
  order (fingerprint), it makes the page's own retries and double clicks one
  request — duplicates get the stored response, ``Idempotent-Replayed: true``;
- the order (``run_once`` of the durable backstop): the charge and its record
  ``order:<id>`` commit in one transaction of the shop's database, so a reload,
  Back, a second tab or any new token for the same order replays the first
  charge instead of charging again. A new order is the only way to pay again.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from flask import (
    Flask,
    Request,
    Response,
    abort,
    jsonify,
    redirect,
    render_template,
    request,
    session,
    url_for,
)

from token_service.client.durable import (
    StoredResponse,
    create_records_table,
    request_fingerprint,
    retry_transaction,
    run_once,
)
from token_service.errors import InvalidRequest
from token_service.server.frontend import asset_response
from token_service.server.responses import register_error_handlers

View = Callable[..., Any]
Guard = Callable[[View], View]
SCOPE = "payment.create"
HERE = Path(__file__).resolve().parent
ITEM = {"item": "Single-origin coffee beans, 250 g", "amount_cents": 1250, "currency": "EUR"}

metadata = sa.MetaData()
orders = sa.Table(
    "orders",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("shopper", sa.String(64), nullable=False, index=True),
    sa.Column("item", sa.String(100), nullable=False),
    sa.Column("amount_cents", sa.Integer, nullable=False),
    sa.Column("currency", sa.String(3), nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
)
charges = sa.Table(
    "charges",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    # The schema's own word on it too: one charge per order.
    sa.Column("order_id", sa.String(32), sa.ForeignKey("orders.id"), nullable=False, unique=True),
    sa.Column("amount_cents", sa.Integer, nullable=False),
    sa.Column("currency", sa.String(3), nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
)


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def charge_id(number: int) -> str:
    return f"ch_{number:04d}"


def create_database(url: str) -> sa.Engine:
    """The shop's database (SQLite is enough for the demo), with the idempotency records table."""
    # Waiting writers (two tabs paying the same order) queue on SQLite's lock instead of failing.
    engine = sa.create_engine(url, connect_args={"timeout": 30} if url.startswith("sqlite") else {})
    metadata.create_all(engine)
    create_records_table(engine)
    return engine


def order_view(conn: sa.Connection, order_id: str) -> dict[str, Any] | None:
    """An order as the page and the API show it: its status comes from the charges table."""
    row = conn.execute(sa.select(orders).where(orders.c.id == order_id)).one_or_none()
    if row is None:
        return None
    paid = conn.execute(sa.select(charges).where(charges.c.order_id == order_id)).one_or_none()
    return {
        "id": row.id,
        "shopper": row.shopper,
        "item": row.item,
        "amount_cents": row.amount_cents,
        "currency": row.currency,
        "status": "paid" if paid else "unpaid",
        "charge": _charge_json(paid) if paid else None,
    }


def _charge_json(row: sa.Row[Any]) -> dict[str, Any]:
    return {
        "id": charge_id(row.id),
        "order_id": row.order_id,
        "amount_cents": row.amount_cents,
        "currency": row.currency,
        "created_at": row.created_at.isoformat(timespec="milliseconds"),
    }


def shopper_of(req: Request) -> str | None:
    """Who is paying: the shop's own session (the token is bound to it as its subject)."""
    shopper: str | None = session.get("shopper")
    return shopper


def order_of(req: Request) -> str | None:
    """Which order is paid: the URL's (the token is bound to it as its fingerprint)."""
    order_id = (req.view_args or {}).get("order_id")
    return str(order_id) if order_id else None


def create_shop(
    guard: Callable[..., Guard],
    token_service_url: str,
    engine: sa.Engine,
    *,
    charge_delay_seconds: float = 0.0,
    token_ttl_seconds: int | None = None,
    secret_key: str | None = None,
) -> Flask:
    """The shop app.

    ``guard(subject=..., fingerprint=...)`` makes the decorator that protects
    the charge view (the demo passes ``require_token`` with its client and
    scope); ``charge_delay_seconds`` stands for a slow payment provider;
    ``token_ttl_seconds`` is what the page asks its tokens to live (default: the
    service's).
    """
    app = Flask(__name__, root_path=str(HERE))
    app.secret_key = secret_key or secrets.token_hex(32)
    app.config.update(SESSION_COOKIE_SAMESITE="Lax", SESSION_COOKIE_HTTPONLY=True)
    app.extensions["shop_engine"] = engine
    register_error_handlers(app)

    def shopper() -> str:
        if "shopper" not in session:
            session["shopper"] = "shopper-" + secrets.token_hex(6)
        return str(session["shopper"])

    def new_order(owner: str) -> str:
        order_id = "ord_" + secrets.token_hex(8)
        with engine.begin() as conn:
            conn.execute(sa.insert(orders).values(id=order_id, shopper=owner, created_at=_now(), **ITEM))
        return order_id

    def own_order(conn: sa.Connection, order_id: str) -> dict[str, Any]:
        order = order_view(conn, order_id)
        if order is None or order["shopper"] != session.get("shopper"):
            abort(404)
        return order

    @app.get("/")
    def home() -> Response:
        """The shopper's latest order; a first visit opens one (every later one is an explicit action)."""
        owner = shopper()
        with engine.connect() as conn:
            latest = conn.execute(
                sa.select(orders.c.id)
                .where(orders.c.shopper == owner)
                .order_by(orders.c.created_at.desc())
                .limit(1)
            ).scalar()
        order_id = latest or new_order(owner)
        return redirect(url_for("page", order_id=order_id))

    @app.get("/orders/<order_id>")
    def page(order_id: str) -> Response:
        shopper()
        with engine.connect() as conn:
            order = own_order(conn, order_id)
        html = render_template(
            "checkout.html",
            order=order,
            config={
                "tokenService": token_service_url,
                "scope": SCOPE,
                "tokenTtlSeconds": token_ttl_seconds,
                "order": order,
            },
        )
        response = Response(html, mimetype="text/html")
        # Back must not show a cached "unpaid" page of an order paid since: always ask the shop.
        response.headers["Cache-Control"] = "no-store"
        return response

    @app.get("/static/vendor/token-client.js")
    def bundled_helper() -> Response:
        # The shop's own copy of the helper (a real shop bundles the npm package in
        # frontend/): the page works, and says so, while the token service is down.
        return asset_response()

    @app.post("/api/orders")
    def create_order() -> tuple[Response, int]:
        order_id = new_order(shopper())
        return jsonify(id=order_id, url=url_for("page", order_id=order_id)), 201

    @app.get("/api/orders/<order_id>")
    def get_order(order_id: str) -> Response:
        with engine.connect() as conn:
            response = jsonify(own_order(conn, order_id))
        response.headers["Cache-Control"] = "no-store"
        return response

    @app.post("/api/orders/<order_id>/charge")
    @guard(subject=shopper_of, fingerprint=order_of)
    def charge(order_id: str) -> Response:
        if request.get_data() not in (b"", b"{}"):
            raise InvalidRequest("The charge takes no fields: the order says what to pay.", {})
        with engine.connect() as conn:
            order = own_order(conn, order_id)

        def pay(conn: sa.Connection) -> StoredResponse:
            time.sleep(charge_delay_seconds)  # the payment provider at work
            result = conn.execute(
                sa.insert(charges).values(
                    order_id=order_id,
                    amount_cents=order["amount_cents"],
                    currency=order["currency"],
                    created_at=_now(),
                )
            )
            row = conn.execute(sa.select(charges).where(charges.c.id == result.inserted_primary_key[0])).one()
            return StoredResponse.json(201, {"charge": _charge_json(row)})

        # Keyed by the order, not by the token: any token for this order ends here.
        outcome = retry_transaction(
            engine,
            lambda conn: run_once(
                conn,
                f"order:{order_id}",
                pay,
                fingerprint=request_fingerprint(order_id, order["amount_cents"], order["currency"]),
            ),
        )
        stored = outcome.response
        response = Response(stored.body, status=stored.status, headers=dict(stored.headers))
        if outcome.replayed:
            response.headers["Idempotent-Replayed"] = "true"
        return response

    @app.get("/api/charges")
    def my_charges() -> Response:
        """The shopper's own charges (one per paid order, whatever happened on the page)."""
        mine = sa.select(orders.c.id).where(orders.c.shopper == session.get("shopper"))
        with engine.connect() as conn:
            rows = conn.execute(
                sa.select(charges).where(charges.c.order_id.in_(mine)).order_by(charges.c.id)
            ).all()
        response = jsonify(charges=[_charge_json(row) for row in rows])
        response.headers["Cache-Control"] = "no-store"
        return response

    @app.get("/healthz")
    def healthz() -> Response:
        return jsonify(status="ok")

    return app
