"""``Idempotency-Key`` middleware for any ASGI app: Starlette, FastAPI, Django's ASGI handler.

::

    import redis.asyncio
    from token_service.client.asgi import IdempotencyMiddleware

    app = IdempotencyMiddleware(app, redis.asyncio.Redis.from_url(url))
    # Starlette / FastAPI: app.add_middleware(IdempotencyMiddleware, store=redis.asyncio.Redis...)

Exactly the semantics of the WSGI middleware (:mod:`token_service.client.wsgi`), from the same
decisions (:mod:`._idempotency_core`) on the same record, on ``redis.asyncio``
(docs/integrations/asgi.md). Pure ASGI: importing it needs neither Starlette nor FastAPI nor Django.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, MutableMapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from token_service.client._engine import drive_async
from token_service.client._fingerprint import RequestFacts
from token_service.client._idempotency_core import Answer, BodyEndedEarly, Middleware, Relay, declared_length
from token_service.client._idempotency_options import IdempotencyOptions
from token_service.client._idempotency_store import AsyncIdempotencyStore
from token_service.client._stored_response import default_store_status
from token_service.errors import OutcomeNotRecorded

__all__ = ["IdempotencyMiddleware", "IdempotencyOptions", "default_store_status"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _headers(scope: Scope) -> dict[str, str]:
    """Lower-case names; a repeated header's values joined with ", " (as HTTP allows)."""
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", ()):
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def _facts(scope: Scope, headers: dict[str, str], body: bytes) -> RequestFacts:
    return RequestFacts(
        method=scope["method"].upper(),
        path=scope.get("path", ""),
        query=scope.get("query_string", b"").decode("latin-1"),
        body=body,
        content_type=headers.get("content-type"),
        headers=headers,
    )


def default_identity(scope: Scope) -> str:
    """Who the client is: its ``Authorization`` header (hashed into the record key, never stored)."""
    return _headers(scope).get("authorization", "")


async def send_answer(send: Send, answer: Answer) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": answer.status,
            "headers": [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in answer.headers],
        }
    )
    await send({"type": "http.response.body", "body": answer.body, "more_body": False})


class IdempotencyMiddleware(Middleware[ASGIApp, Scope, AsyncIdempotencyStore]):
    """Wrap an ASGI app so that each ``Idempotency-Key`` runs at most one request (see module docs).

    ``store`` is a ``redis.asyncio`` client (or cluster client) or an
    :class:`AsyncIdempotencyStore`. ``identity`` and ``applies`` get the ASGI scope.
    """

    store_class = AsyncIdempotencyStore
    default_identity = staticmethod(default_identity)

    @functools.cached_property
    def header_name(self) -> str:
        return self.core.options.header.lower()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (self.applies is not None and not self.applies(scope)):
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        screened = self.core.screen(scope["method"], headers.get(self.header_name))
        if screened is None:
            await self.app(scope, receive, send)
            return
        if isinstance(screened, Answer):
            await send_answer(send, screened)
            return
        read_body = functools.partial(self._read_body, receive, headers)
        facts = functools.partial(_facts, scope, headers)
        admitted = await drive_async(self.admitting(scope, screened, read_body, facts))
        if isinstance(admitted, Answer):
            await send_answer(send, admitted)
            return
        await _Relay(self, admitted).run(scope, _replay_body(admitted.body, receive), send)

    async def _read_body(self, receive: Receive, headers: dict[str, str]) -> bytes | None:
        """The whole body, or None when over ``max_body_bytes`` (nothing more is read then);
        :class:`BodyEndedEarly` when the client leaves first, or it is short of its Content-Length."""
        limit = self.core.options.max_body_bytes
        declared = declared_length(headers.get("content-length", ""))
        if declared is not None and declared > limit:
            return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise BodyEndedEarly
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        if declared is not None and size < declared:
            raise BodyEndedEarly
        return b"".join(chunks)


def _replay_body(body: bytes, receive: Receive) -> Receive:
    """The app's ``receive``: the body read already, then the client's own messages (disconnect)."""
    first: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return first.pop() if first else await receive()

    return replay


class _Relay(Relay[AsyncIdempotencyStore]):
    """The key is held (``core.ahold``) while the app runs; the outcome is settled just before the
    last body message goes out (a client holding the whole response may send its duplicate at
    once), or when the app ends without finishing its response, or fails."""

    hold: AbstractAsyncContextManager[Any] | None = None
    client_gone = False

    async def run(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def relay(message: Message) -> None:
            kind = message["type"]
            recorder = self.recorder
            if kind == "http.response.start":
                headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in message.get("headers", ())]
                self.recorder = self.core.recorder(int(message["status"]), headers)
            elif kind == "http.response.body" and recorder is not None:
                done = recorder.feed(message.get("body", b""))
                if not message.get("more_body", False):
                    recorder.complete = True
                    done = True
                if done:
                    # a response that could not be kept is broken off: its end never goes out
                    await self._settle(failed=False, breaking=True)
            elif kind == "http.response.pathsend" and recorder is not None:
                # a file sent by the server itself: its status and headers are what can be kept
                recorder.size = recorder.length or 0
                await self._settle(failed=False, breaking=True)
            try:
                await send(message)
            except BaseException:
                # the client is gone: the app did its work, record what went out
                self.client_gone = True
                await self._settle(failed=False)
                raise

        async def watch() -> Message:
            received = await receive()
            if received["type"] == "http.disconnect":
                self.client_gone = True
            return received

        self.hold = self.core.ahold(self.store, self.attempt)
        await self.hold.__aenter__()
        try:
            await self.app(scope, watch, relay)
        except asyncio.CancelledError:
            # cancelled (the client left, the server stops): a started response did its work
            await self._settle(failed=False)
            raise
        except BaseException:
            await self._settle(failed=not self.client_gone)
            raise
        await self._settle(failed=False)

    async def _settle(self, *, failed: bool, breaking: bool = False) -> None:
        if not self._settles(failed):
            return
        # In a task of its own: a cancelled request (anyio cancels every later await in its
        # scope) must still store or free its key and stop renewing, never leave it held.
        task = asyncio.ensure_future(self._finish())
        _SETTLING.add(task)
        task.add_done_callback(_SETTLING.discard)
        not_recorded = await asyncio.shield(task)
        if not_recorded is not None and breaking:
            raise not_recorded

    async def _finish(self) -> OutcomeNotRecorded | None:
        # stored (or freed) while the key is still held and renewed, then renewing stops
        try:
            return await self.core.asettle(self.store, self.attempt, self.recorder)
        finally:
            if self.hold is not None:
                await self.hold.__aexit__(None, None, None)


# settling tasks a cancelled request left running (a reference keeps them from being collected)
_SETTLING: set[asyncio.Task[OutcomeNotRecorded | None]] = set()
