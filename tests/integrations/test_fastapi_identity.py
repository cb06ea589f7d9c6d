"""FastAPI's ``require_token``: ``subject`` and ``fingerprint`` may be async callables (the module
docs: "callables given the Request, sync or async"), and ``fingerprint=[...]`` names body fields.
Each must reproduce what the token was issued with: a token bound to alice runs for alice only.
On the testing kit's in-memory store (fakeredis running the shipped Lua).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI, Request

from token_service.client import AsyncTokenClient, fields_fingerprint
from token_service.client.fastapi import require_token

SCOPE = "payment.create"
runs = itertools.count(1)


def tokens() -> AsyncTokenClient:
    raise AssertionError("overridden by the test")


async def user(request: Request) -> str | None:
    return request.headers.get("X-User-Id")


async def order(request: Request) -> str | None:
    return request.headers.get("X-Order")


app = FastAPI()


@app.post("/async-identity", status_code=201)
@require_token(tokens, SCOPE, subject=user, fingerprint=order)
async def pay_async_identity() -> dict[str, Any]:
    return {"run": next(runs)}


@app.post("/body-fields", status_code=201)
@require_token(tokens, SCOPE, subject=user, fingerprint=["amount", "currency"])
async def pay_body_fields(payment: dict[str, Any]) -> dict[str, Any]:
    return {"run": next(runs)}


@pytest_asyncio.fixture
async def http(async_token_client: AsyncTokenClient) -> AsyncIterator[httpx.AsyncClient]:
    app.dependency_overrides[tokens] = lambda: async_token_client
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://shop") as client:
        yield client
    app.dependency_overrides.clear()


@pytest.mark.asyncio
async def test_async_subject_and_fingerprint_callables_are_awaited(
    http: httpx.AsyncClient, async_token_client: AsyncTokenClient
) -> None:
    token = (await async_token_client.generate(SCOPE, subject="alice", fingerprint="order-7")).token
    mallory = {"Idempotency-Token": token, "X-User-Id": "mallory", "X-Order": "order-7"}
    other_order = {"Idempotency-Token": token, "X-User-Id": "alice", "X-Order": "order-8"}
    alice = {"Idempotency-Token": token, "X-User-Id": "alice", "X-Order": "order-7"}
    refused = [await http.post("/async-identity", headers=headers) for headers in (mallory, other_order)]
    assert [(answer.status_code, answer.json()["code"]) for answer in refused] == [
        (403, "token_mismatch"),
        (403, "token_mismatch"),
    ]
    first = await http.post("/async-identity", headers=alice)
    again = await http.post("/async-identity", headers=alice)
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json()
    assert again.headers["Idempotent-Replayed"] == "true"


@pytest.mark.asyncio
async def test_body_fields_are_the_fingerprint(
    http: httpx.AsyncClient, async_token_client: AsyncTokenClient
) -> None:
    payment = {"amount": 1999, "currency": "EUR", "note": "not bound"}
    bound = fields_fingerprint({"amount": 1999, "currency": "EUR"})
    token = (await async_token_client.generate(SCOPE, subject="alice", fingerprint=bound)).token
    headers = {"Idempotency-Token": token, "X-User-Id": "alice"}
    changed = await http.post("/body-fields", headers=headers, json={**payment, "amount": 1})
    assert (changed.status_code, changed.json()["code"]) == (403, "token_mismatch")
    first = await http.post("/body-fields", headers=headers, json=payment)
    again = await http.post("/body-fields", headers=headers, json={**payment, "note": "other"})
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json()
    assert again.headers["Idempotent-Replayed"] == "true"
