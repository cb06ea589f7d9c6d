"""The example app: a checkout page's token, and a payment endpoint that charges once per token.

Redis: ``TOKEN_SERVICE_REDIS_URL`` (default the local one). The user is the
``X-User-Id`` header here; a real app takes it from its session.
"""

from __future__ import annotations

import asyncio
import itertools
import os

from fastapi import FastAPI, Request, Response
from pydantic import BaseModel

from token_service.client import AsyncTokenClient
from token_service.client.fastapi import require_token

REDIS_URL = os.environ.get("TOKEN_SERVICE_REDIS_URL", "redis://127.0.0.1:6379/0")
tokens = AsyncTokenClient.from_redis(REDIS_URL)
app = FastAPI(title="payments")
charges: dict[str, dict[str, object]] = {}  # stands in for a bank
_ids = itertools.count(1)


class Payment(BaseModel):
    amount: int
    currency: str


class Receipt(BaseModel):
    id: str
    amount: int
    currency: str


def user(request: Request) -> str:
    return request.headers.get("X-User-Id", "anonymous")


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/checkout/token", status_code=201)
async def checkout_token(request: Request, response: Response) -> dict[str, str]:
    """What the checkout page fetches before showing Pay (bound to the user)."""
    response.headers["Cache-Control"] = "no-store"
    issued = await tokens.generate("payment.create", subject=user(request), ttl_seconds=900)
    return {"token": issued.token}


@app.post("/payments", status_code=201)
@require_token(tokens, "payment.create", subject=user, wait_seconds=10)
async def create_payment(payment: Payment, response: Response) -> Receipt:
    await asyncio.sleep(0.2)  # the bank takes its time: a double click lands meanwhile
    receipt = Receipt(id=f"pay_{next(_ids)}", amount=payment.amount, currency=payment.currency)
    charges[receipt.id] = receipt.model_dump()
    response.headers["Location"] = f"/payments/{receipt.id}"
    return receipt


@app.get("/payments")
async def list_payments() -> dict[str, object]:
    return {"charges": list(charges.values())}
