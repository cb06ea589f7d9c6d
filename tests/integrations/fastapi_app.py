"""The FastAPI app tests/integrations/test_fastapi.py runs under uvicorn (Redis from TS_TEST_REDIS_URL)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import redis
import redis.asyncio
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from token_service.client import AsyncTokenClient
from token_service.client.fastapi import require_token

REDIS_URL = os.environ.get("TS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
tokens = AsyncTokenClient.from_redis(REDIS_URL)
# the same app with its token store down: every guarded call must fail closed
unreachable = AsyncTokenClient.from_redis("redis://127.0.0.1:1/0", retry=1, timeout=0.5)
# a socket timeout past the slow endpoint's 30 s BLPOP (redis-py 8 defaults to 5 s: a loaded machine
# releases it later than that)
counters = redis.asyncio.Redis.from_url(REDIS_URL, socket_timeout=40)
app = FastAPI()


class Payment(BaseModel):
    amount: int
    currency: str


class Receipt(BaseModel):
    id: str
    amount: int
    currency: str


class Declined(Exception):
    pass


def user(request: Request) -> str | None:
    return request.headers.get("X-User-Id")


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/payments", status_code=201, response_model=Receipt)
@require_token(tokens, "payment.create", subject=user, fingerprint=["amount", "currency"])
async def create_payment(payment: Payment, response: Response) -> Receipt:
    run = await counters.incr("runs:payments")
    await asyncio.sleep(0.3)  # a bank call: duplicates arrive while it runs
    receipt = Receipt(id=f"pay_{run}", amount=payment.amount, currency=payment.currency)
    response.headers["Location"] = f"/payments/{receipt.id}"
    response.headers["X-Not-Replayed"] = "only the first answer has it"
    return receipt


@app.post("/payments/waiting", status_code=201)
@require_token(tokens, "payment.create", subject=user, wait_seconds=30)
async def create_payment_waiting(payment: Payment) -> dict[str, object]:
    run = await counters.incr("runs:waiting")
    await asyncio.sleep(0.5)
    return {"id": f"pay_{run}", "amount": payment.amount}


@app.post("/sync")
@require_token(tokens, "sync.op")
def sync_endpoint() -> dict[str, int]:  # a plain def: FastAPI's thread pool runs it
    import redis as sync_redis

    return {"run": int(sync_redis.Redis.from_url(REDIS_URL).incr("runs:sync"))}


@app.post("/raw")
@require_token(tokens, "raw.op", replay_headers=("Content-Type", "X-Order"))
async def raw() -> Response:
    run = await counters.incr("runs:raw")
    return JSONResponse({"run": run}, status_code=202, headers={"X-Order": f"o-{run}", "X-Other": "x"})


@app.post("/missing")
@require_token(tokens, "missing.op")
async def missing() -> None:
    await counters.incr("runs:missing")
    raise HTTPException(404, detail="no such order")


@app.post("/unavailable")
@require_token(tokens, "unavailable.op")
async def unavailable() -> dict[str, int]:
    run = await counters.incr("runs:unavailable")
    if run == 1:
        raise HTTPException(503, detail="bank down")
    return {"run": run}


@app.post("/crash")
@require_token(tokens, "crash.op")
async def crash() -> dict[str, int]:
    run = await counters.incr("runs:crash")
    if run == 1:
        raise RuntimeError("bug")
    return {"run": run}


@app.post("/declined")
@require_token(tokens, "declined.op", terminal=(Declined,))
async def declined() -> None:
    await counters.incr("runs:declined")
    raise Declined("card declined")


@app.post("/big")
@require_token(tokens, "big.op", max_result_bytes=1024)
async def big() -> dict[str, str]:
    await counters.incr("runs:big")
    return {"blob": "x" * 5000}


@app.post("/store-down")
@require_token(unreachable, "down.op")
async def store_down() -> None:
    await counters.incr("runs:down")


@app.post("/stream")
@require_token(tokens, "stream.op")
async def stream() -> StreamingResponse:
    await counters.incr("runs:stream")

    async def chunks():  # type: ignore[no-untyped-def]
        for part in (b"a", b"b"):
            yield part

    return StreamingResponse(chunks(), media_type="text/plain")


@app.post("/slow-reports", status_code=201)
@require_token(tokens, "report.build", lease_seconds=2)
async def slow_report() -> dict[str, int]:
    """Slower than two of its 2 s leases (tests/integrations/test_fastapi_renewal.py): the first run
    lasts until the test pushes ``release:slow_report``; later runs return at once."""
    run = int(await counters.incr("runs:slow_report"))
    if run == 1:
        await counters.blpop(["release:slow_report"], timeout=30)
    return {"run": run}


hook_counts = redis.Redis.from_url(REDIS_URL)  # hooks are plain (sync) callables


def _hook(name: str) -> Any:
    return lambda guard, *error: hook_counts.incr(f"hooks:{name}")


@app.post("/hooked", status_code=201)
@require_token(
    tokens,
    "payment.create",
    subject=user,
    on_replay=_hook("replay"),
    on_conflict=_hook("conflict"),
    on_mismatch=_hook("mismatch"),
)
async def hooked() -> dict[str, bool]:
    await counters.incr("runs:hooked")
    return {"ok": True}
