"""The hand-written baseline: the least a Flask endpoint can do for the same two jobs.

generate: ``secrets.token_urlsafe`` + one ``SET EX``. consume: one small Lua
GET/SET. No schema, no digest, no auth, no metrics, no logs: the service must
come within the issue's budget of this while doing all of those.
Run by the benchmark under gunicorn with exactly the service's flags:
``gunicorn --config python:token_service.server.gunicorn_conf 'benchmarks.baseline_app:create_app()'``.
"""

from __future__ import annotations

import os
import secrets

import redis
from flask import Flask, jsonify, request
from flask.typing import ResponseReturnValue

KEY_PREFIX = "bl:"
# GET, check, SET: one-shot use of a token whose value is its scope.
CONSUME_LUA = """
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
if v ~= ARGV[1] then return -1 end
redis.call('SET', KEYS[1], '!', 'KEEPTTL')
return 1
"""


def create_app() -> Flask:
    app = Flask("baseline")
    client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    consume_script = client.register_script(CONSUME_LUA)

    @app.get("/healthz")
    def healthz() -> ResponseReturnValue:
        return jsonify(status="ok")

    @app.post("/token/generate")
    def generate() -> ResponseReturnValue:
        body = request.get_json()
        token = secrets.token_urlsafe(32)
        ttl_seconds = body.get("ttl_seconds") or 300
        client.set(KEY_PREFIX + token, body["scope"], ex=ttl_seconds)
        return jsonify(token=token, scope=body["scope"], ttl_seconds=ttl_seconds), 201

    @app.post("/token/consume")
    def consume() -> ResponseReturnValue:
        body = request.get_json()
        won = consume_script(keys=[KEY_PREFIX + body["token"]], args=[body["scope"]])
        if won == 1:
            return jsonify(outcome="consumed")
        return jsonify(code="token_used" if won == -1 else "token_invalid"), 409

    return app
