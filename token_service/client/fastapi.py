"""``@require_token`` for FastAPI: an endpoint runs at most once per anti-duplicate token.

::

    tokens = AsyncTokenClient.from_redis("redis://localhost:6379/0")   # or AsyncTokenClient(url, key)

    @app.post("/payments", status_code=201)
    @require_token(tokens, "payment.create", subject=lambda request: request.headers["X-User-Id"])
    async def create_payment(payment: Payment, response: Response) -> Receipt:
        ...

Flask's decorator on an :class:`~token_service.client.AsyncTokenClient`, on the
same decisions (:mod:`._require_token_core`); docs/integrations/fastapi.md says
what is stored and replayed. An endpoint's returned value is stored as its JSON
form, so a duplicate returns it and FastAPI renders it exactly as the first (same
``status_code``, ``response_model``, response class); a returned ``Response`` is
stored as bytes; an ``HTTPException`` is the response the app's handler renders,
then goes on to FastAPI. Only this module imports FastAPI.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Unpack

from token_service.errors import TokenError

from ._client import AsyncTokenClient
from ._extras import install, missing
from ._idempotency_core import declared_length
from ._require_token_core import (
    Replay,
    Reply,
    RequireToken,
    RequireTokenArgs,
    ValueReply,
    answer_of,
    with_options,
)
from ._stored_response import REPLAYED_HEADER, StoredResponse
from .guard import AsyncGuard

try:
    import anyio
    from fastapi import Depends, Request, Response
    from fastapi.encoders import jsonable_encoder
    from fastapi.exception_handlers import http_exception_handler
    from fastapi.responses import FileResponse, StreamingResponse
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
except ModuleNotFoundError as exc:
    missing(exc, __name__, ("fastapi", "starlette", "anyio"), install("fastapi"))

__all__ = ["problem_response", "require_token"]

# The hidden parameters the decorator adds to the endpoint's signature (FastAPI injects them).
_REQUEST = "token_service_request"
_RESPONSE = "token_service_response"
_CLIENT = "token_service_client"  # when the client comes from a dependency
RequestValue = Callable[[Request], Any]


def problem_response(error: TokenError) -> Response:
    """``error``'s problem+json answer, as the decorator sends it (an endpoint may answer one too)."""
    return _response(answer_of(error))


def _response(answer: Reply) -> Response:
    response = Response(answer.body, status_code=answer.status)
    for name, value in answer.headers:
        response.headers.append(name, value)
    return response


async def _identity(core: RequireToken, request: Request) -> tuple[str | None, str | None]:
    """The core's identity of the request; ``subject`` and ``fingerprint`` may be async here."""
    # the body only for body fields: FastAPI has read it for the endpoint already (cached)
    body = await request.body() if core.fields is not None else b""
    found = core.identity(request, lambda: body, request.headers.get("content-type"))
    subject, fingerprint = [await value if inspect.isawaitable(value) else value for value in found]
    return subject, fingerprint


def _replay(stored: Any, response: Response) -> Any:
    """A duplicate's answer from the token's result: a Response, or the first call's value."""
    if isinstance(stored, dict) and stored.get("kind") == "value":
        headers = [(name, value) for name, value in stored.get("h", [])]
        if "omitted" not in stored:
            if stored.get("s") is not None:
                response.status_code = stored["s"]
            for name, value in headers:
                response.headers.append(name, value)
            response.headers[REPLAYED_HEADER] = "true"
            return stored.get("v")
        # too large to keep: the status and headers, and the mark that the body was dropped
        stored = StoredResponse(stored.get("s") or 200, b"", headers, omitted=stored["omitted"]).to_result()
    return _response(answer_of(Replay(stored)))


def _signature(
    endpoint: Callable[..., Any], dependency: Callable[..., Any] | None
) -> tuple[inspect.Signature, str, str, tuple[str, ...]]:
    """The endpoint's signature, annotations resolved (FastAPI would resolve string ones in this
    module's globals), with a Request and a Response in it (the endpoint's own, shared, or hidden
    keyword-only ones: the names of both and which were added) and the client's dependency if given."""
    signature = inspect.signature(endpoint)
    hints = typing.get_type_hints(endpoint, include_extras=True)
    parameters = [
        parameter.replace(annotation=hints.get(name, parameter.annotation))
        for name, parameter in signature.parameters.items()
    ]
    names: list[str] = []
    added: list[str] = []
    extra: list[inspect.Parameter] = []

    def hide(name: str, **how: Any) -> None:
        if name in signature.parameters:
            raise TypeError(f"{endpoint.__qualname__} has a parameter {name!r}: this decorator's own")
        extra.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, **how))

    for kind, hidden in ((Request, _REQUEST), (Response, _RESPONSE)):
        of_kind = (
            p.name for p in parameters if isinstance(p.annotation, type) and issubclass(p.annotation, kind)
        )
        declared = next(of_kind, None)
        if declared is None:
            hide(hidden, annotation=kind)
            added.append(hidden)
        names.append(declared or hidden)
    if dependency is not None:
        hide(_CLIENT, default=Depends(dependency))
    # keyword-only parameters go last; **kwargs (if any) after them
    variadic = [p for p in parameters if p.kind is inspect.Parameter.VAR_KEYWORD]
    plain = [p for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD]
    returns = hints.get("return", signature.return_annotation)
    resigned = signature.replace(parameters=[*plain, *extra, *variadic], return_annotation=returns)
    return resigned, names[0], names[1], tuple(added)


@with_options
def require_token(
    client: AsyncTokenClient | Callable[..., Any],
    scope: str,
    *,
    subject: RequestValue | None = None,
    fingerprint: RequestValue | Sequence[str] | None = None,
    **options: Unpack[RequireTokenArgs],
) -> Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]]:
    """Decorate a FastAPI endpoint (below ``@app.post(...)``) so each token runs it at most once
    (docs/integrations/fastapi.md). ``client`` is an :class:`AsyncTokenClient`, or a FastAPI
    dependency returning one, resolved per request (so ``app.dependency_overrides`` applies)."""
    if not isinstance(client, AsyncTokenClient) and not callable(client):
        raise TypeError("FastAPI's require_token takes an AsyncTokenClient, or a dependency returning one")
    core = RequireToken.of(locals(), http_errors=(HTTPException,))  # first: before any other local
    dependency = None if isinstance(client, AsyncTokenClient) else client

    def decorate(endpoint: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
        signature, request_name, response_name, added = _signature(endpoint, dependency)
        # a plain endpoint runs in a thread, as FastAPI runs it
        run = (
            endpoint
            if inspect.iscoroutinefunction(endpoint)
            else functools.partial(run_in_threadpool, endpoint)
        )

        @functools.wraps(endpoint)
        async def guarded_endpoint(*args: Any, **kwargs: Any) -> Any:
            request: Request = kwargs[request_name]
            response: Response = kwargs[response_name]
            for name in added:
                del kwargs[name]
            tokens = client if dependency is None else kwargs.pop(_CLIENT)
            if not isinstance(tokens, AsyncTokenClient):
                name, kind = getattr(dependency, "__qualname__", repr(dependency)), type(tokens).__name__
                raise TypeError(f"require_token's dependency {name} returned {kind}, not an AsyncTokenClient")
            token = core.token_of(request.headers.get(core.header))
            if isinstance(token, TokenError):
                return problem_response(token)
            guard = await core.abegin(tokens, token, *await _identity(core, request))
            if isinstance(guard, TokenError):
                return problem_response(guard)
            if isinstance(guard, Replay):
                return _replay(guard.result, response)
            request.state.token_guard = guard
            try:
                value = await run(*args, **kwargs)
            except BaseException as exc:
                await core.araised(guard, exc, functools.partial(_http_reply, request, exc))
                raise  # FastAPI answers it as ever (and a yield dependency sees it)
            try:
                reply = await _reply_for(core, guard, request, value, response)
                not_recorded = None if reply is None else await core.asettle(guard, reply)
            except BaseException:
                # not answerable (a FileResponse whose file is missing: a 500): freed, as after an exception
                await core.asettle(guard, None)
                raise
            if not_recorded is not None:
                return problem_response(not_recorded)  # never a success whose outcome was not kept
            return value

        guarded_endpoint.__signature__ = signature  # type: ignore[attr-defined]
        return guarded_endpoint

    return decorate


async def _reply_for(
    core: RequireToken, guard: AsyncGuard, request: Request, value: Any, response: Response
) -> Reply | ValueReply | None:
    """What to settle for the endpoint's ``value`` (its injected ``response``: the status and headers
    it set); None: a stream, recorded as it goes out."""
    if not isinstance(value, Response):
        return ValueReply(response.status_code, response.headers.items(), jsonable_encoder(value))
    status, headers = value.status_code, list(value.headers.items())
    if isinstance(value, FileResponse):
        # sent by Starlette from its path: kept when it fits the caps (read now), else its size
        size = (await anyio.Path(value.path).stat()).st_size
        if size > core.cap_bytes or request.method == "HEAD":
            return Reply(status, headers, omitted=size)
        return Reply(status, headers, await anyio.Path(value.path).read_bytes())
    if not isinstance(value, StreamingResponse):
        return _reply_of(value)
    length = declared_length(value.headers.get("content-length", ""))
    now = core.streamed(Reply(status, headers), request.method, length)
    if now is None:
        value.body_iterator = core.arecord(guard, value.body_iterator, Reply(status, headers), length)
    return now


def _reply_of(value: Response) -> Reply:
    """A response with its body in hand (a stream or a file: none, stored as omitted)."""
    body = getattr(value, "body", None)  # a Response class of its own may send without one
    kept = bytes(body) if isinstance(body, bytes | bytearray | memoryview) else None
    headers = list(value.headers.items())
    return Reply(value.status_code, headers, kept or b"", None if kept is not None else 0)


async def _http_reply(request: Request, exc: BaseException) -> Reply | None:
    """The response the app answers an ``HTTPException`` with: its handler for the status, else for
    the class, else FastAPI's default (Starlette's lookup, on the handlers it keeps in the scope).
    None when the handler breaks or answers no response (the token is freed; Starlette, calling it
    again, answers that itself)."""
    assert isinstance(exc, HTTPException)
    exceptions, statuses = request.scope.get("starlette.exception_handlers", ({}, {}))
    handler = statuses.get(exc.status_code) or next(
        (exceptions[kind] for kind in type(exc).__mro__ if kind in exceptions), http_exception_handler
    )
    try:
        if inspect.iscoroutinefunction(handler):
            answer = await handler(request, exc)
        else:  # as Starlette runs a plain one: in a thread
            answer = await run_in_threadpool(handler, request, exc)
            if inspect.isawaitable(answer):
                answer = await answer
    except Exception:
        return None
    return _reply_of(answer) if isinstance(answer, Response) else None
