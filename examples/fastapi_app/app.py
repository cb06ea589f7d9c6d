"""A checkout page's token, bound to the payment it shows, and a payment endpoint that charges once per token.

docs/integrations/fastapi.md shows this file as it is. Redis: ``TOKEN_SERVICE_REDIS_URL``
(default the local one). The user is the ``X-User-Id`` header here; a real app takes it
from its session.
"""

from __future__ import annotations

import asyncio
import os

import redis.asyncio
from fastapi import FastAPI, Request, Response
from pydantic import BaseModel

from token_service.client import AsyncTokenClient, fields_fingerprint
from token_service.client.fastapi import require_token

REDIS_URL = os.environ.get("TOKEN_SERVICE_REDIS_URL", "redis://127.0.0.1:6379/0")
tokens = AsyncTokenClient.from_redis(REDIS_URL)
# Stands in for a bank. In Redis, not in this process: under several workers
# (uvicorn --workers 2) every one numbers and lists the same charges.
bank = redis.asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
app = FastAPI(title="payments")


class Payment(BaseModel):
    amount: int
    currency: str


class Receipt(BaseModel):
    id: str
    amount: int
    currency: str


def user(request: Request) -> str:
    return request.headers.get("X-User-Id", "anonymous")  # your authentication decides who it is


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/checkout/token", status_code=201)
async def checkout_token(payment: Payment, request: Request, response: Response) -> dict[str, str]:
    """What the checkout page fetches before showing Pay: bound to the user and to this payment."""
    response.headers["Cache-Control"] = "no-store"
    bound = fields_fingerprint(payment.model_dump())
    issued = await tokens.generate(
        "payment.create", subject=user(request), fingerprint=bound, ttl_seconds=900
    )
    return {"token": issued.token}


@app.post("/payments", status_code=201)
@require_token(
    tokens,
    "payment.create",
    subject=user,
    fingerprint=["amount", "currency"],  # the body's fields must be the ones the token was issued for
    wait_seconds=10,  # a duplicate waits for the first and gets its receipt
    lease_seconds=30,  # renewed while the endpoint runs
)
async def create_payment(payment: Payment, response: Response) -> Receipt:
    await asyncio.sleep(0.2)  # the bank takes its time: a double click lands meanwhile
    number = await bank.incr("examples:fastapi:payments")
    receipt = Receipt(id=f"pay_{number}", amount=payment.amount, currency=payment.currency)
    await bank.rpush("examples:fastapi:charges", receipt.model_dump_json())
    response.headers["Location"] = f"/payments/{receipt.id}"
    return receipt


@app.get("/payments")
async def list_payments() -> dict[str, object]:
    charges = await bank.lrange("examples:fastapi:charges", 0, -1)
    return {"charges": [Receipt.model_validate_json(charge) for charge in charges]}
