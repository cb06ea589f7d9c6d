"""Django: the ``Idempotency-Key`` middleware and the ``@require_token`` view decorator.

Both are configured from ``settings.TOKEN_SERVICE`` (docs/integrations/django.md: the
settings, the middleware's ``IDEMPOTENCY_KEY`` options, the decorator's options).

**The middleware** (sync and async: WSGI or ASGI) is the WSGI/ASGI middlewares'
semantics on their shared decisions (:mod:`._idempotency_core`); a streamed
response is stored without its body (``Idempotent-Body-Omitted``).

**The decorator** is ``token_service.client.flask.require_token`` for Django, on the
same decisions (:mod:`._require_token_core`): sync views on a :class:`TokenClient`,
``async def`` views on an :class:`AsyncTokenClient`, both made from the settings
unless ``client=`` is given. ``Http404``, ``PermissionDenied``, ``BadRequest`` and
``SuspiciousOperation`` are the response Django answers them with, settled as one,
then re-raised (so an ``ATOMIC_REQUESTS`` transaction still rolls back).

Only this module imports Django.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import itertools
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, Unpack

import redis
import redis.asyncio

from token_service import defaults
from token_service.errors import TokenError

from ._client import AsyncTokenClient, TokenClient
from ._engine import Flow, drive, drive_async
from ._extras import install, missing
from ._fingerprint import RequestFacts
from ._idempotency_core import (
    Answer,
    Attempt,
    IdempotencyCore,
    declared_length,
)
from ._idempotency_options import options_from_settings
from ._idempotency_store import AsyncIdempotencyStore, IdempotencyStore
from ._require_token_core import Replay, Reply, RequireToken, RequireTokenArgs, answer_of, with_options
from .guard import AsyncGuard, Guard

try:
    from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
    from django.conf import settings
    from django.core.exceptions import BadRequest, PermissionDenied, SuspiciousOperation
    from django.core.handlers.asgi import ASGIRequest
    from django.core.handlers.exception import get_exception_response
    from django.core.signals import setting_changed
    from django.http import (
        Http404,
        HttpRequest,
        HttpResponse,
        HttpResponseBase,
        RawPostDataException,
        StreamingHttpResponse,
    )
    from django.http.multipartparser import MultiPartParserError
    from django.urls import get_resolver, get_urlconf
    from django.utils.module_loading import import_string
    from django.views import debug
except ModuleNotFoundError as exc:
    missing(exc, __name__, ("django", "asgiref"), install("django"))

__all__ = [
    "IdempotencyKeyMiddleware",
    "async_token_client",
    "problem_response",
    "require_token",
    "token_client",
]

_ClientT = TypeVar("_ClientT", TokenClient, AsyncTokenClient)

_lock = threading.Lock()
_sync_client: TokenClient | None = None
# one client per event loop: under WSGI each async view may run on a loop of its own
_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncTokenClient] = (
    weakref.WeakKeyDictionary()
)
# the event loop each client= AsyncTokenClient first served: its pooled connections belong to it
_first_loops: weakref.WeakKeyDictionary[AsyncTokenClient, weakref.ref[asyncio.AbstractEventLoop]] = (
    weakref.WeakKeyDictionary()
)


def _settings() -> dict[str, Any]:
    configured = getattr(settings, "TOKEN_SERVICE", None)
    if not isinstance(configured, dict):
        raise TypeError("settings.TOKEN_SERVICE must be a dict (REDIS_URL, or URL and API_KEY)")
    return configured


def token_client() -> TokenClient:
    """The :class:`TokenClient` of ``settings.TOKEN_SERVICE`` (one per process)."""
    global _sync_client
    with _lock:
        if _sync_client is None:
            _sync_client = _from_settings(TokenClient)
        return _sync_client


def async_token_client() -> AsyncTokenClient:
    """The :class:`AsyncTokenClient` of ``settings.TOKEN_SERVICE`` for the running event loop."""
    loop = asyncio.get_running_loop()
    client = _async_clients.get(loop)
    if client is None:
        client = _async_clients[loop] = _from_settings(AsyncTokenClient)
    return client


def _forget_clients(*, setting: str, **_: Any) -> None:
    """``settings.TOKEN_SERVICE`` changed (``override_settings``): the next request's clients come
    from the new value. The old ones are not closed (a request in flight may hold one): collected."""
    global _sync_client
    if setting == "TOKEN_SERVICE":
        with _lock:
            _sync_client = None
            _async_clients.clear()


setting_changed.connect(_forget_clients, dispatch_uid="token_service.client.django")


def _from_settings(kind: type[_ClientT]) -> _ClientT:
    """A ``kind`` of client: to Redis (``REDIS_URL``, ``KEY_PREFIX``) or to the service (``URL``)."""
    options = _settings()
    if options.get("REDIS_URL"):
        prefix = options.get("KEY_PREFIX", defaults.KEY_PREFIX)
        return kind.from_redis(options["REDIS_URL"], key_prefix=prefix)
    if options.get("URL"):
        return kind(options["URL"], options.get("API_KEY"))
    raise TypeError("settings.TOKEN_SERVICE needs REDIS_URL, or URL and API_KEY")


def problem_response(error: TokenError) -> HttpResponse:
    """``error``'s problem+json answer, as the decorator sends it (a view may answer one too)."""
    return _response(answer_of(error))


def _response(answer: Reply | Answer) -> HttpResponse:
    """``answer`` as Django's response, with the answer's own Content-Type (if any), never a stored
    Content-Length (Django's handler frames the body it sends)."""
    response = HttpResponse(answer.body, status=answer.status)
    del response["Content-Type"]
    for name, value in answer.headers:
        if name.lower() != "content-length":
            response.headers[name] = value
    return response


def _declared_length(request: HttpRequest) -> int | None:
    """The request's Content-Length, or None (Django's own development server passes any through)."""
    return declared_length(request.META.get("CONTENT_LENGTH") or "")


def _facts(request: HttpRequest, body: bytes) -> RequestFacts:
    return RequestFacts(
        method=(request.method or "GET").upper(),
        path=request.path,
        query=request.META.get("QUERY_STRING", ""),
        body=body,
        content_type=request.META.get("CONTENT_TYPE"),
        headers={name.lower(): value for name, value in request.headers.items()},
    )


def default_identity(request: HttpRequest) -> str:
    """The ``Authorization`` header, else the logged-in user (after AuthenticationMiddleware); or ""."""
    authorization = request.headers.get("Authorization")
    if authorization:
        return str(authorization)
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return f"user:{user.pk}"
    return ""


# -- the Idempotency-Key middleware --------------------------------------------------------------


# the middleware's settings that are not IdempotencyOptions: which paths, who the client is, which Redis
_OWN_SETTINGS = frozenset({"PATHS", "IDENTITY", "REDIS_URL"})


class IdempotencyKeyMiddleware:
    """``Idempotency-Key`` for Django (see the module docs): ``TOKEN_SERVICE["IDEMPOTENCY_KEY"]``."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
        service = _settings()
        options = {name.upper(): value for name, value in service.get("IDEMPOTENCY_KEY", {}).items()}
        # every other setting is an IdempotencyOptions field, upper case (a misspelt one is refused)
        self.core = IdempotencyCore(
            options_from_settings(
                {name: value for name, value in options.items() if name not in _OWN_SETTINGS}
            )
        )
        self.paths = tuple(options.get("PATHS", ()))
        identity = options.get("IDENTITY", default_identity)
        self.identity: Callable[[HttpRequest], str | None] = (
            import_string(identity) if isinstance(identity, str) else identity
        )
        redis_url = options.get("REDIS_URL") or service.get("REDIS_URL")
        if not redis_url:
            raise TypeError("the Idempotency-Key middleware needs TOKEN_SERVICE['REDIS_URL']")
        prefix = service.get("KEY_PREFIX", defaults.KEY_PREFIX)
        # a URL, or a Redis client of the middleware's kind used as it is (a test's in-memory store:
        # token_service.testing), as TokenClient.from_redis takes either for the decorator
        kind, store = (
            (redis.asyncio.Redis, AsyncIdempotencyStore) if self.is_async else (redis.Redis, IdempotencyStore)
        )
        self.store: Any = store(
            kind.from_url(redis_url) if isinstance(redis_url, str) else redis_url, key_prefix=prefix
        )

    def _screen(self, request: HttpRequest) -> str | Answer | None:
        if self.paths and not request.path.startswith(self.paths):
            return None
        return self.core.screen(request.method or "GET", request.headers.get(self.core.options.header))

    def _prepare(self, request: HttpRequest) -> Attempt | Answer | None:
        core = self.core
        screened = self._screen(request)
        if screened is None or isinstance(screened, Answer):
            return screened
        declared = _declared_length(request)
        if declared is not None and declared > core.options.max_body_bytes:
            return core.too_large()
        try:
            body = request.body  # read once; the view reads it again from Django's cache
        except OSError:  # UnreadablePostError: the client went away mid-body
            return core.truncated()
        if len(body) > core.options.max_body_bytes:
            return core.too_large()
        if declared is not None and len(body) < declared:
            # the client sent less than it declared (then closed): neither claim the key nor run the view
            return core.truncated()
        return core.attempt(self.store, self.identity(request), screened, _facts(request, body))

    def _recorded(self, response: HttpResponseBase) -> Any:
        recorder = self.core.recorder(response.status_code, list(response.items()))
        if response.streaming:
            # never buffered: the work is done, duplicates get the status and headers only
            recorder.size = int(response.get("Content-Length") or 0)
        else:
            assert isinstance(response, HttpResponse)
            recorder.feed(response.content)
            recorder.complete = True
        return recorder

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        prepared = self._prepare(request)
        if not isinstance(prepared, Attempt):  # not guarded, or answered without the view
            return self.get_response(request) if prepared is None else _response(prepared)
        answer = self.core.claim(self.store, prepared)
        if answer is not None:
            return _response(answer)
        recorder = None
        with self.core.hold(self.store, prepared):  # held (renewed) until the outcome is stored
            try:
                response = self.get_response(request)
                recorder = self._recorded(response)
            finally:
                not_recorded = self.core.settle(self.store, prepared, recorder)
        if not_recorded is not None:
            return _response(self.core.not_recorded(not_recorded))  # never a success not kept
        return response

    async def __acall__(self, request: HttpRequest) -> Any:
        prepared = self._prepare(request)
        if not isinstance(prepared, Attempt):
            return await self.get_response(request) if prepared is None else _response(prepared)
        answer = await self.core.aclaim(self.store, prepared)
        if answer is not None:
            return _response(answer)
        recorder = None
        async with self.core.ahold(self.store, prepared):
            try:
                response = await self.get_response(request)
                recorder = self._recorded(response)
            finally:
                not_recorded = await self.core.asettle(self.store, prepared, recorder)
        if not_recorded is not None:
            return _response(self.core.not_recorded(not_recorded))
        return response


# -- the @require_token view decorator ---------------------------------------------------------


def _find_request(args: tuple[Any, ...]) -> HttpRequest:
    for arg in args[:2]:  # a function view's first argument, a method's second
        if isinstance(arg, HttpRequest):
            return arg
    raise TypeError("@require_token decorates a view: its first argument must be the request")


def _client_of(client: Any, is_async: bool) -> TokenClient | AsyncTokenClient:
    """``client=``, else the settings' one, if it is of the kind the view needs; else an error before
    the token is touched. An async view's own ``client=`` serves the event loop it first served (its
    pooled connections belong to it): on another (under WSGI each request of an async view runs on a
    loop of its own) a request failed with a 500 and left its token PROCESSING until the lease ran out."""
    if not is_async:
        tokens = client or token_client()
        if not isinstance(tokens, TokenClient):
            raise TypeError("a sync view needs a TokenClient")
        return tokens
    tokens = client or async_token_client()
    if not isinstance(tokens, AsyncTokenClient):
        raise TypeError("an async view needs an AsyncTokenClient")
    loop = asyncio.get_running_loop()
    with _lock:
        first = loop if client is None else _first_loops.setdefault(tokens, weakref.ref(loop))()
    if first is not loop:
        raise RuntimeError(
            "require_token(client=...): this AsyncTokenClient serves the event loop it first served, "
            "and this request runs on another (under WSGI each request of an async view has a loop of "
            "its own). Leave client= unset (the settings' client, one per event loop), make the client "
            "in the request, or serve the app over ASGI."
        )
    return tokens


def _body_ended_early(request: HttpRequest) -> bool:
    """A body shorter than its Content-Length: the client sent part of it, then closed (gunicorn
    then hands Django the short body without an error). Read before the token is touched (Django
    caches it for the view); one over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` is left for the view to stream."""
    declared = _declared_length(request)
    if not declared:
        return False
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if limit is not None and declared > limit:
        return False
    try:
        return len(request.body) < declared
    except RawPostDataException:
        return False  # read already as a stream, by something before this view
    except OSError:  # UnreadablePostError: the client went away mid-body
        return True


def _rendered(response: Any) -> HttpResponseBase:
    # a TemplateResponse or a DRF Response is rendered by Django after the view: render it now
    render = getattr(response, "render", None)
    if callable(render) and not getattr(response, "is_rendered", True):
        response = render()
    if not isinstance(response, HttpResponseBase):
        raise TypeError(f"a view returned {type(response).__name__}, not an HttpResponse")
    return response


# Django's exceptions that stand for a 4xx of their own (as response_for_exception answers them)
_HTTP_STATUSES: tuple[tuple[type[Exception], int], ...] = (
    (Http404, 404),
    (PermissionDenied, 403),
    (MultiPartParserError, 400),
    (BadRequest, 400),
    (SuspiciousOperation, 400),
)
_HTTP_ERRORS = tuple(kind for kind, _ in _HTTP_STATUSES)


def _http_reply(request: HttpRequest, exc: BaseException) -> Reply | None:
    """The response Django answers one of its HTTP exceptions with (``response_for_exception``'s),
    without the log line it writes once the re-raised exception reaches it."""
    status = next(code for kind, code in _HTTP_STATUSES if isinstance(exc, kind))
    if settings.DEBUG and isinstance(exc, Http404):
        response = debug.technical_404_response(request, exc)
    elif settings.DEBUG and isinstance(exc, BadRequest | SuspiciousOperation):
        response = debug.technical_500_response(request, type(exc), exc, exc.__traceback__, status_code=400)
    else:
        response = get_exception_response(request, get_resolver(get_urlconf()), status, exc)
    try:
        response = _rendered(response)
    except Exception:
        return None  # its template broke: the token is freed (Django, rendering it again, answers that)
    head = Reply(response.status_code, list(response.items()))
    if isinstance(response, HttpResponse):
        return dataclasses.replace(head, body=response.content)
    return dataclasses.replace(head, omitted=0)  # a stream: it never goes out, Django answers anew


@with_options
def require_token(
    scope: str,
    *,
    client: TokenClient | AsyncTokenClient | None = None,
    subject: Callable[[HttpRequest], str | None] | None = None,
    fingerprint: Callable[[HttpRequest], str | None] | Sequence[str] | None = None,
    **options: Unpack[RequireTokenArgs],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a Django view (sync or ``async def``) so each token runs it at most once
    (docs/integrations/django.md). ``client`` defaults to the settings' (a sync view needs a
    :class:`TokenClient`, an async one an :class:`AsyncTokenClient`)."""
    core = RequireToken.of(locals(), http_errors=_HTTP_ERRORS)  # first: before any other local

    def decorate(view: Callable[..., Any]) -> Callable[..., Any]:
        is_async = inspect.iscoroutinefunction(view) or iscoroutinefunction(view)

        def guarded(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Flow[HttpResponseBase]:
            # one flow for both kinds of view: driven blocking (a sync view) or awaiting (an async one)
            request = _find_request(args)
            token = core.token_of(request.headers.get(core.header))
            if isinstance(token, TokenError):
                return _response(answer_of(token))
            if _body_ended_early(request):
                return _response(answer_of(core.truncated()))
            tokens = _client_of(client, is_async)
            identity = core.identity(request, lambda: request.body, request.META.get("CONTENT_TYPE"))
            guard = yield from core.beginning(tokens, token, *identity)
            if isinstance(guard, TokenError | Replay):
                return _response(answer_of(guard))
            try:
                response = _rendered((yield functools.partial(view, *args, **kwargs)))
            except BaseException as exc:
                render = functools.partial(_http_reply, request, exc)
                # an async view's exception is rendered in a thread, as Django renders it
                yield from core.raising(
                    guard, exc, sync_to_async(render, thread_sensitive=False) if is_async else render
                )
                raise
            now = _settle_now(core, guard, request, response)
            if now is _READ_AHEAD:
                try:
                    now = yield functools.partial(_read_ahead, core, response)
                except BaseException:
                    yield from core.settling(guard, None)  # it broke before it went out: freed
                    raise
            not_recorded = None if now is None else (yield from core.settling(guard, now))
            if not_recorded is not None:
                return _response(answer_of(not_recorded))  # never a success whose outcome was not kept
            return response

        if is_async:

            @functools.wraps(view)
            async def guarded_async_view(*args: Any, **kwargs: Any) -> HttpResponseBase:
                return await drive_async(guarded(args, kwargs))

            return guarded_async_view

        @functools.wraps(view)
        def guarded_view(*args: Any, **kwargs: Any) -> HttpResponseBase:
            return drive(guarded(args, kwargs))

        return guarded_view

    return decorate


def _settle_now(core: RequireToken, guard: Guard | AsyncGuard, request: HttpRequest, response: Any) -> Any:
    """What to settle now (a :class:`Reply`); None when the response is a stream, wrapped here to be
    recorded as it goes out; ``_READ_AHEAD`` for an async view's stream that Django sends after
    the view's event loop is gone (a synchronous one; an async one outside ASGI)."""
    head = Reply(response.status_code, list(response.items()))
    length = declared_length(str(response.get("Content-Length") or ""))
    if isinstance(response, HttpResponse):
        return dataclasses.replace(head, body=response.content)
    if not isinstance(response, StreamingHttpResponse):
        return dataclasses.replace(head, omitted=length or 0)
    now = core.streamed(head, request.method, length)
    if now is not None:
        return now
    if response.is_async and (isinstance(guard, Guard) or isinstance(request, ASGIRequest)):
        response.streaming_content = core.arecord(guard, response.streaming_content, head, length)
    elif isinstance(guard, Guard):
        response.streaming_content = core.record(guard, response.streaming_content, head, length)
    else:
        return _READ_AHEAD
    return None


_READ_AHEAD = object()


async def _read_ahead(core: RequireToken, response: StreamingHttpResponse) -> Reply:
    """What to settle for an async view's stream that Django sends after the view's event loop is
    gone (under WSGI), where its guard cannot be settled: read before it goes out. A synchronous one
    (a FileResponse) is read up to the caps, else omitted with its declared length (0 without one: it
    cannot be counted before it goes out); an async one is read whole, as Django would read it on a
    loop of its own (``StreamingHttpResponse.__iter__``)."""
    head = Reply(response.status_code, list(response.items()))
    is_async = response.is_async
    read: list[bytes] = []
    rest: Iterator[bytes] = iter(())
    if is_async:
        read = [chunk async for chunk in response.streaming_content]
        whole = True
    else:
        rest = iter(response.streaming_content)
        whole = await sync_to_async(_read_up_to)(rest, read, core.cap_bytes)
    response.streaming_content = itertools.chain(read, rest)
    size = sum(map(len, read))
    if whole and size <= core.cap_bytes:
        return dataclasses.replace(head, body=b"".join(read))
    omitted = size if is_async else declared_length(str(response.get("Content-Length") or "")) or 0
    return dataclasses.replace(head, omitted=omitted)


def _read_up_to(chunks: Iterator[bytes], read: list[bytes], cap: int) -> bool:
    """Read ``chunks`` into ``read`` until they end (True) or pass ``cap`` bytes (False)."""
    size = 0
    for chunk in chunks:
        read.append(chunk)
        size += len(chunk)
        if size > cap:
            return False
    return True
