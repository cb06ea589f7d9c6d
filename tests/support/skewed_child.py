"""The client process of the clock-skew tests, run under ``faketime`` by :mod:`tests.support.skew`.

``python -m tests.support.skewed_child SCENARIO JSON_ARGS``. It reports one JSON
object a line on stdout: first ``{"time": time.time()}`` (the parent checks the
shift), then whatever the scenario reports; it exits 0 when the scenario ran.
(``time.sleep`` is mended for faketime by tests/support/faketime_site/sitecustomize.py.)
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from typing import Any


def report(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def told() -> dict[str, Any]:
    """The parent's next line (it says when to act: never this process's clock)."""
    told: dict[str, Any] = json.loads(sys.stdin.readline())
    return told


def _client(args: dict[str, Any], *, asyncio_client: bool = False) -> Any:
    from token_service.client import AsyncTokenClient, TokenClient
    from token_service.client.advanced import DirectLimits

    kind = AsyncTokenClient if asyncio_client else TokenClient
    if args["transport"] == "http":
        return kind(args["base_url"], api_key=args["api_key"])
    limits = DirectLimits(default_lease_seconds=args["default_lease_seconds"])
    return kind.from_redis(args["redis_url"], limits=limits)


def _work(args: dict[str, Any]) -> Callable[[], str]:
    import redis

    counter = redis.Redis.from_url(args["redis_url"])

    def work() -> str:
        counter.incr(args["counter_key"])
        report(started=True)
        told()  # work as long as the parent needs: it says when the duplicate has been turned away
        return "done"

    return work


def guard(args: dict[str, Any]) -> None:
    """Hold a guard's lease (the service's default length) through work longer than it."""
    from token_service.client import idempotent, keyed_guard

    work = _work(args)
    mode = args["mode"]
    if mode == "async":

        async def main() -> str:
            async with _client(args, asyncio_client=True) as client:

                async def awork() -> str:
                    return await asyncio.to_thread(work)

                result: str = await client.guard(args["token"], args["scope"]).run(awork)
                return result

        report(result=asyncio.run(main()))
        return
    client = _client(args)
    if mode == "sync":
        report(result=client.guard(args["token"], args["scope"]).run(work))
    elif mode == "keyed":
        report(result=keyed_guard(client, args["scope"], args["key"]).run(work))
    elif mode == "idempotent":

        @idempotent(client, args["scope"], key="key")
        def decorated(key: str) -> str:
            return work()

        report(result=decorated(args["key"]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    client.close()


def wait(args: dict[str, Any]) -> None:
    """A duplicate that waits (``wait_seconds``) for the holder's result instead of giving up."""
    from token_service.errors import TokenInProgress

    client = _client(args)
    try:
        result = client.guard(args["token"], args["scope"], wait_seconds=args["wait_seconds"]).run(
            _work(args)
        )
    except TokenInProgress as exc:
        report(in_progress=True, retry_after_seconds=exc.retry_after_seconds)
    else:
        report(result=result)
    client.close()


def durable_claim(args: dict[str, Any]) -> None:
    """Claim a durable record (committed at once, the two-transaction flow) when the parent says."""
    import sqlalchemy as sa

    from token_service.client.durable import RecordInProgress, claim, records_table

    engine = sa.create_engine(args["url"])
    table = records_table(args["table"])
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))  # connected before the parent starts counting
    report(ready=True)
    told()
    try:
        with engine.begin() as conn:
            claimed = claim(conn, args["key"], lease_seconds=args["lease_seconds"], table=table)
    except RecordInProgress as exc:
        report(outcome="in_progress", retry_after_seconds=exc.retry_after_seconds)
    else:
        report(outcome="claimed", taken_over=getattr(claimed, "taken_over", None))
    engine.dispose()


def middleware(args: dict[str, Any]) -> None:
    """One request through the WSGI Idempotency-Key middleware, whose app works until told."""
    import redis
    from werkzeug.test import Client

    from token_service.client.wsgi import IdempotencyMiddleware

    counter = redis.Redis.from_url(args["redis_url"])

    def app(environ: Any, start_response: Any) -> list[bytes]:
        counter.incr(args["counter_key"])
        report(started=True)
        told()
        start_response("201 Created", [("Content-Type", "text/plain")])
        return [b"created"]

    wrapped = IdempotencyMiddleware(
        app, counter, lock_seconds=args["lock_seconds"], identity=lambda environ: "client-1"
    )
    response = Client(wrapped).post("/orders", data=b"{}", headers={"Idempotency-Key": args["key"]})
    report(status=response.status_code, body=response.get_data(as_text=True))


def asgi_middleware(args: dict[str, Any]) -> None:
    """The same through the ASGI Idempotency-Key middleware (its lock renewed by an asyncio task)."""
    import httpx
    import redis
    import redis.asyncio

    from token_service.client.asgi import IdempotencyMiddleware

    counter = redis.Redis.from_url(args["redis_url"])

    async def app(scope: Any, receive: Any, send: Any) -> None:
        counter.incr(args["counter_key"])
        report(started=True)
        await asyncio.to_thread(told)
        await send(
            {"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"text/plain")]}
        )
        await send({"type": "http.response.body", "body": b"created"})

    async def main() -> httpx.Response:
        store = redis.asyncio.Redis.from_url(args["redis_url"])
        wrapped = IdempotencyMiddleware(
            app, store, lock_seconds=args["lock_seconds"], identity=lambda scope: "client-1"
        )
        transport = httpx.ASGITransport(app=wrapped)
        async with httpx.AsyncClient(transport=transport, base_url="http://shop.test") as client:
            response = await client.post("/orders", content=b"{}", headers={"Idempotency-Key": args["key"]})
        await store.aclose()
        return response

    response = asyncio.run(main())
    report(status=response.status_code, body=response.text)


def admin(args: dict[str, Any]) -> None:
    """The operators' view of two PROCESSING records: one lease live, one run out."""
    import redis

    from token_service.ops.admin import Admin, Filter

    operator = Admin(redis.Redis.from_url(args["redis_url"]))
    shown = {}
    for name, ref in args["refs"].items():
        record = operator.show(ref).to_dict()
        shown[name] = {key: record[key] for key in ("lease_expired", "lease_expires_in_seconds")}
    stuck, cursor = [], "0"
    while True:
        page = operator.scan(Filter(state="PROCESSING", lease_expired=True), cursor=cursor)
        stuck += [record.ref for record in page.records]
        cursor = page.cursor
        if cursor == "0":
            break
    report(shown=shown, stuck=sorted(stuck))


SCENARIOS = {
    "guard": guard,
    "wait": wait,
    "durable_claim": durable_claim,
    "middleware": middleware,
    "asgi_middleware": asgi_middleware,
    "admin": admin,
}


def main() -> None:
    scenario, raw = sys.argv[1], sys.argv[2]
    report(time=time.time())
    SCENARIOS[scenario](json.loads(raw))


if __name__ == "__main__":
    main()
