"""A payment endpoint behind both lines of defence: the token in Redis, a record in the database.

``@require_token`` begins the token in Redis and replays its stored response
to duplicates. Inside the view, ``run_once_for_token`` records the payment
under the token's digest in the same transaction as the charge, so even if
Redis forgets the token was used (a failover, a restart between fsyncs) the
database refuses to charge twice and answers with the first response.
"""

from __future__ import annotations

import sqlalchemy as sa
from flask import Flask, Response, request

from token_service.client import TokenClient
from token_service.client.durable import (
    FingerprintMismatch,
    StoredResponse,
    create_records_table,
    request_fingerprint,
    retry_transaction,
    run_once_for_token,
)
from token_service.client.flask import current_guard, problem_response, require_token
from token_service.errors import InvalidRequest

metadata = sa.MetaData()
payments = sa.Table(
    "payments",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("order_id", sa.String(64), nullable=False),
    sa.Column("amount_cents", sa.Integer, nullable=False),
)


def create_app(engine: sa.Engine, tokens: TokenClient) -> Flask:
    metadata.create_all(engine)
    create_records_table(engine)  # or run the SQL of docs/durable.md in a migration
    app = Flask(__name__)

    @app.post("/payments")
    @require_token(tokens, scope="payment.create")
    def create_payment() -> Response:
        order = request.get_json(silent=True)
        if not (
            isinstance(order, dict)
            and isinstance(order.get("order_id"), str)
            and isinstance(order.get("amount_cents"), int)
        ):
            return problem_response(
                InvalidRequest("order_id (string) and amount_cents (integer) are required")
            )
        guard = current_guard()
        assert guard is not None  # set by @require_token

        def charge(conn: sa.Connection) -> StoredResponse:
            payment_id = conn.execute(
                sa.insert(payments).values(order_id=order["order_id"], amount_cents=order["amount_cents"])
            ).inserted_primary_key[0]
            return StoredResponse.json(201, {"payment_id": payment_id, "order_id": order["order_id"]})

        try:
            outcome = retry_transaction(
                engine,
                lambda conn: run_once_for_token(
                    conn, guard.token, charge, fingerprint=request_fingerprint(order)
                ),
            )
        except FingerprintMismatch as exc:
            return problem_response(exc)  # 422: this token already paid for another order
        stored = outcome.response
        response = Response(stored.body, status=stored.status, headers=dict(stored.headers))
        if outcome.replayed:
            response.headers["Idempotent-Replayed"] = "true"
        return response

    return app


if __name__ == "__main__":
    # python examples/payments.py — needs Redis on localhost and writes ./payments.sqlite
    create_app(
        sa.create_engine("sqlite:///payments.sqlite"), TokenClient.from_redis("redis://localhost:6379/0")
    ).run(port=5000)
