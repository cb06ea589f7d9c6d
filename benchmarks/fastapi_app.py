"""The hand-written baseline's twin in FastAPI, served by uvicorn: the third baseline.

The same two jobs as ``baseline_app.py`` (generate: ``secrets.token_urlsafe``
+ one ``SET EX``; consume: the same small Lua GET/SET), written the way a
FastAPI user would: pydantic bodies, ``async def`` views, ``redis.asyncio``.
Run by the benchmark as
``uvicorn benchmarks.fastapi_app:app --workers N --no-access-log`` (uvloop and
httptools, as ``uvicorn[standard]`` installs them).
"""

from __future__ import annotations

import os
import secrets

import redis.asyncio
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from benchmarks.baseline_app import CONSUME_LUA, KEY_PREFIX

app = FastAPI()
client = redis.asyncio.Redis.from_url(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
consume_script = client.register_script(CONSUME_LUA)


class GenerateBody(BaseModel):
    scope: str
    ttl_seconds: int | None = None


class ConsumeBody(BaseModel):
    token: str
    scope: str


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/token/generate", status_code=201)
async def generate(body: GenerateBody) -> dict[str, object]:
    token = secrets.token_urlsafe(32)
    ttl_seconds = body.ttl_seconds or 300
    await client.set(KEY_PREFIX + token, body.scope, ex=ttl_seconds)
    return {"token": token, "scope": body.scope, "ttl_seconds": ttl_seconds}


@app.post("/token/consume", response_model=None)
async def consume(body: ConsumeBody) -> dict[str, str] | JSONResponse:
    won = await consume_script(keys=[KEY_PREFIX + body.token], args=[body.scope])
    if won == 1:
        return {"outcome": "consumed"}
    return JSONResponse({"code": "token_used" if won == -1 else "token_invalid"}, status_code=409)
