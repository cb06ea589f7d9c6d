"""A Starlette app and a FastAPI app behind the ASGI IdempotencyMiddleware, for uvicorn in tests.

``uvicorn tests.client.asgi_apps:starlette_app`` (or ``fastapi_app``). Each run
of ``POST /orders`` counts itself in Redis (``orders:runs``) so a test sees how
often the body ran across everything. The request body says what to answer:
``{"sleep": s}`` takes a moment, ``{"status": n}`` answers n, ``{"crash": true}``
raises, ``{"stream": n, "chunk": bytes}`` streams n chunks, ``{"file": true}``
sends a file. ``TEST_WAIT_SECONDS`` sets the middleware's ``wait_seconds``,
``TEST_LOCK_SECONDS`` its ``lock_seconds`` (30).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import redis
import redis.asyncio
from fastapi import FastAPI, Request
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from token_service.client.asgi import IdempotencyMiddleware

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
STORE_URL = os.environ.get("TEST_STORE_URL", REDIS_URL)
counter = redis.Redis.from_url(REDIS_URL)
FILE = os.path.join(tempfile.gettempdir(), f"asgi-receipt-{os.getpid()}.txt")
with open(FILE, "wb") as handle:
    handle.write(b"receipt " * 512)


async def answer(body: dict[str, Any]) -> Response:
    run = await asyncio.to_thread(counter.incr, "orders:runs")
    if body.get("sleep"):
        await asyncio.sleep(float(body["sleep"]))
    if body.get("crash"):
        raise RuntimeError("bug")
    if "status" in body:
        return JSONResponse(
            {"status": body["status"]}, status_code=body["status"], headers={"Retry-After": "1"}
        )
    if "stream" in body:
        chunk = b"x" * int(body.get("chunk", 1000))

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(int(body["stream"])):
                yield chunk

        return StreamingResponse(chunks(), media_type="application/octet-stream")
    if body.get("file"):
        return FileResponse(FILE, media_type="text/plain")
    headers = {"Location": f"/orders/{run}", "Set-Cookie": "s=1"}
    return JSONResponse({"run": run, **body}, status_code=201, headers=headers)


def middleware_options() -> dict[str, Any]:
    return {
        "wait_seconds": float(os.environ.get("TEST_WAIT_SECONDS", "0")),
        "lock_seconds": int(os.environ.get("TEST_LOCK_SECONDS", "30")),
    }


async def starlette_orders(request: StarletteRequest) -> Response:
    return await answer(await request.json())


async def healthz(request: StarletteRequest) -> Response:
    return JSONResponse({"status": "ok"})


starlette_app = Starlette(
    routes=[Route("/orders", starlette_orders, methods=["POST"]), Route("/healthz", healthz)],
)
starlette_app.add_middleware(
    IdempotencyMiddleware,  # type: ignore[arg-type]
    store=redis.asyncio.Redis.from_url(STORE_URL),
    **middleware_options(),
)

fastapi_app = FastAPI()


@fastapi_app.post("/orders")
async def fastapi_orders(request: Request) -> Response:
    return await answer(await request.json())


@fastapi_app.get("/healthz")
async def fastapi_healthz() -> dict[str, str]:
    return {"status": "ok"}


fastapi_app.add_middleware(
    IdempotencyMiddleware,  # type: ignore[arg-type]
    store=redis.asyncio.Redis.from_url(STORE_URL),
    **middleware_options(),
)
