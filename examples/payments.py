"""A payment endpoint behind both lines of defence: the token in Redis, a record in the database.

``@require_token`` begins the token in Redis and replays its stored response
to duplicates. Inside the view, ``run_once_for_token`` records the payment
under the token's digest in the same transaction as the charge, so even if
Redis forgets the token was used (a failover, a restart between fsyncs) the
database refuses to charge twice and answers with the first response.
"""

from __future__ import annotations

import os

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


def main() -> None:
    """python -m examples.payments: the token service's Redis from TOKEN_SERVICE_REDIS_URL,
    the database from PAYMENTS_DATABASE_URL (default: ./payments.sqlite); port 5000."""
    redis_url = os.environ.get("TOKEN_SERVICE_REDIS_URL")
    if not redis_url:
        raise SystemExit("set TOKEN_SERVICE_REDIS_URL to the Redis of your token service")
    database_url = os.environ.get("PAYMENTS_DATABASE_URL", "sqlite:///payments.sqlite")
    create_app(sa.create_engine(database_url), TokenClient.from_redis(redis_url)).run(port=5000)


if __name__ == "__main__":
    main()
