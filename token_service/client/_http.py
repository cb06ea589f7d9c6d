"""The HTTP transport: the service's JSON API through one pooled httpx client.

Each reply is read as :mod:`._replies` says the contract allows; transport failures become
:class:`ServiceUnavailable`, which the client retries. The call's deadline bounds every wait:
httpx's timeouts are per socket operation (a reply trickling in a byte a second never trips
them), so the pool's streams give each connect, read and write only what is left of the call's
budget (:class:`_DeadlineBackend`). Cancelling the request instead would leave connections
behind in httpcore's pool (encode/httpcore#1093).
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import httpcore
import httpx

from token_service import deadline, defaults
from token_service.errors import ServiceUnavailable

from . import _replies as replies

if TYPE_CHECKING:
    from token_service.records import UseRequest

__all__ = ["AsyncHttpTransport", "HttpTransport"]

T = TypeVar("T")

# Failures after which nothing is known about what the service did: retry with the same request id.
_TRANSIENT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


# The async client's last resort, past the deadline, for what no socket timeout bounds (a
# transport of the caller's own): late enough never to race the streams' own timeouts.
_BACKSTOP_GRACE_SECONDS = 1.0


# -- every socket wait within the call's deadline ----------------------------------------------


def _within(timeout: float | None, late: type[Exception]) -> float | None:
    """A socket operation's timeout, cut to what is left of the call's deadline."""
    left = deadline.remaining_seconds()
    if left is None:
        return timeout
    if left <= 0:
        # settimeout(0) would make the socket non-blocking, not time out
        raise late("the call's timeout is spent")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream:
    """An httpcore stream, sync or async, each wait cut to what is left of the call's deadline
    (an async stream's calls hand back its awaitables, which httpcore awaits at once)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __getattr__(self, name: str) -> Any:  # close or aclose: as it is
        return getattr(self._stream, name)

    def get_extra_info(self, info: str) -> Any:  # asked before each reuse of a connection
        return self._stream.get_extra_info(info)

    def read(self, max_bytes: int, timeout: float | None = None) -> Any:
        return self._stream.read(max_bytes, _within(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> Any:
        return self._stream.write(buffer, _within(timeout, httpcore.WriteTimeout))

    def start_tls(self, timeout: float | None = None, **options: Any) -> Any:  # httpcore names them all
        return _held(self._stream.start_tls(timeout=_within(timeout, httpcore.ConnectTimeout), **options))


class _DeadlineBackend:
    """httpcore's own network backend, sync or async, each stream it opens held to the deadline."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:  # sleep: as it is
        return getattr(self._backend, name)

    # httpcore passes every argument by name: only the timeout is ours to change
    def connect_tcp(self, timeout: float | None = None, **options: Any) -> Any:
        return _held(self._backend.connect_tcp(timeout=_within(timeout, httpcore.ConnectTimeout), **options))

    def connect_unix_socket(self, timeout: float | None = None, **options: Any) -> Any:
        timeout = _within(timeout, httpcore.ConnectTimeout)
        return _held(self._backend.connect_unix_socket(timeout=timeout, **options))


def _held(opened: Any) -> Any:
    """A stream just opened, or (async backend) an awaitable of one, held to the deadline."""
    if not inspect.isawaitable(opened):
        return _DeadlineStream(opened)

    async def held() -> _DeadlineStream:
        return _DeadlineStream(await opened)

    return held()


def _own_transport(limits: httpx.Limits, is_async: bool) -> Any:
    """httpx's own transport on a pool whose streams keep the call's deadline.

    httpx has no option for the pool's network backend (encode/httpx#3749 would add one):
    its pool, ``_pool``, is replaced by one built the same way with the backend set.
    ``tests/client/test_call_deadline.py`` fails if a new httpx stops using it."""
    ssl_context = httpx.create_ssl_context(verify=True, trust_env=True)  # httpx's default, built once
    kind = httpx.AsyncHTTPTransport if is_async else httpx.HTTPTransport
    transport = kind(verify=ssl_context, limits=limits)
    pool = httpcore.AsyncConnectionPool if is_async else httpcore.ConnectionPool
    # either kind of backend, by what it does (httpcore checks no class)
    backend: Any = _DeadlineBackend(httpcore.AnyIOBackend() if is_async else httpcore.SyncBackend())
    transport._pool = pool(  # what httpx.HTTPTransport(limits=limits) gives its pool, and the backend
        ssl_context=ssl_context,
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=backend,
    )
    return transport


def _no_reply(exc: BaseException, timeout_seconds: float) -> ServiceUnavailable:
    left = deadline.remaining_seconds()
    if left is not None and left <= 0:
        return ServiceUnavailable(
            f"No reply from the token service within the call's timeout ({timeout_seconds:g} s): "
            f"{type(exc).__name__}."
        )
    return ServiceUnavailable(f"No reply from the token service: {type(exc).__name__}.")


def _encode(body: dict[str, Any]) -> bytes:
    """The JSON body without its None fields, byte for byte what httpx's ``json=`` would send."""
    present = {key: value for key, value in body.items() if value is not None}
    return json.dumps(present, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _headers(api_key: str | None) -> dict[str, str]:
    # Every request is a POST of a JSON body (encoded by _encode, so httpx does not add the type).
    headers = {
        "Accept": "application/json, application/problem+json",
        # no content coding: a reply's size cap counts the bytes that arrive, and a
        # compressed body could grow a thousandfold past it once decoded
        "Accept-Encoding": "identity",
        "Content-Type": "application/json",
    }
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


class _Urls(dict[str, httpx.URL]):
    """Each API path joined to the client's ``base_url`` once, by httpx's own rule: httpx parses
    and merges a relative URL on every request (the largest part of building one)."""

    def __init__(self, http: httpx.Client | httpx.AsyncClient) -> None:
        super().__init__()
        self._http = http

    def __missing__(self, path: str) -> httpx.URL:
        url = self[path] = self._http.build_request("POST", path).url
        return url


def _use(use: UseRequest) -> dict[str, Any]:
    """The body of a request that uses a token (consume, and begin with its lease)."""
    return {
        "token": use.token,
        "scope": use.scope,
        "subject": use.subject,
        "fingerprint": use.fingerprint,
        "request_id": use.request_id,
    }


class _Request:
    """One operation's request: where it goes, its body, how its reply is read and how much of it."""

    __slots__ = ("body", "cap", "operation", "read")

    def __init__(self, name: str, body: dict[str, Any], read: Callable[[Any], Any], cap: int) -> None:
        self.operation = replies.OPERATIONS[name]
        self.body = _encode(body)
        self.read = read
        self.cap = cap


class _HttpOperations:
    """Each operation once: its path, its JSON body and how its reply is read. The two transports
    differ only in :meth:`_post`: the sync one returns the read reply, the async one a coroutine
    of it (``_client._Transport`` says what each operation's reply is)."""

    # httpx.Client or httpx.AsyncClient, and the attribute holding it (typed by each subclass)
    _http_class: ClassVar[Callable[..., Any]]
    http: Any

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        timeout: float,
        max_connections: int = 20,
        transport: Any = None,  # of the subclass's kind: the public client's signature says which
        max_result_bytes: int = defaults.MAX_RESULT_BYTES,
    ) -> None:
        self.timeout_seconds = timeout
        self.max_result_bytes = max_result_bytes
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        is_async = self._http_class is httpx.AsyncClient
        self.http = self._http_class(
            base_url=base_url,
            headers=_headers(api_key),
            timeout=httpx.Timeout(timeout),
            limits=limits,
            transport=transport if transport is not None else _own_transport(limits, is_async),
        )
        self._urls = _Urls(self.http)

    # The client's call holds the deadline (deadline.within its timeout) and, over HTTP,
    # leaves it to this transport to keep: at every read, never by cancelling.
    keeps_call_deadline: ClassVar[bool] = True

    def _post(self, request: _Request) -> Any:
        raise NotImplementedError

    def _timeout(self) -> httpx.Timeout:
        """httpx's per-operation timeouts, none longer than what is left: the pool's wait too."""
        left = deadline.remaining_seconds()
        if left is None:
            return httpx.Timeout(self.timeout_seconds)
        if left <= 0:
            raise ServiceUnavailable(
                f"No time left for the token service within the call's timeout ({self.timeout_seconds:g} s)."
            )
        return httpx.Timeout(min(self.timeout_seconds, left))

    def _reading(self, request: _Request, response: httpx.Response) -> replies.Reading:
        sent = response.request.url  # named in errors: without any user:password of the base URL
        url = f"{sent.scheme}://{sent.netloc.decode('ascii')}{sent.path}"
        return replies.Reading(request, url, response.status_code, response.headers)

    def _request(self, name: str, body: dict[str, Any], read: Callable[[Any], Any], count: int = 0) -> Any:
        return self._post(_Request(name, body, read, replies.cap_bytes(self.max_result_bytes, count)))

    def issue(
        self, scope: str, subject: str | None, fingerprint: str | None, ttl_seconds: int | None, count: int
    ) -> Any:
        body = {"scope": scope, "subject": subject, "fingerprint": fingerprint, "ttl_seconds": ttl_seconds}
        if count == 1:
            return self._request("generate", body, replies.issued_one, count)
        return self._request("generate_batch", {**body, "count": count}, replies.issued_batch(count), count)

    def consume(self, use: UseRequest) -> Any:
        return self._request("consume", _use(use), replies.consumed)

    def begin(self, use: UseRequest, lease_seconds: int | None) -> Any:
        body = _use(use)
        body["lease_seconds"] = lease_seconds
        return self._request("begin", body, replies.begun)

    def renew(self, token: str, lease_id: str, lease_seconds: int | None) -> Any:
        body = {"token": token, "lease_id": lease_id, "lease_seconds": lease_seconds}
        return self._request("renew", body, replies.renewed)

    def complete(self, token: str, lease_id: str, result: Any) -> Any:
        body = {"token": token, "lease_id": lease_id, "result": result}
        return self._request("complete", body, replies.completed)

    def fail(self, token: str, lease_id: str, retryable: bool, error: Any) -> Any:
        body = {"token": token, "lease_id": lease_id, "retryable": retryable, "error": error}
        return self._request("fail", body, replies.fail_recorded)

    def inspect(self, token: str) -> Any:
        return self._request("inspect", {"token": token}, replies.info)

    def revoke(self, token: str) -> Any:
        return self._request("revoke", {"token": token}, replies.revoked)


class HttpTransport(_HttpOperations):
    """Sync: one ``httpx.Client`` (a connection pool) per client."""

    _http_class = httpx.Client
    http: httpx.Client

    def _post(self, request: _Request) -> Any:
        # the client's call set the deadline; a transport used on its own starts one here
        with deadline.within(self.timeout_seconds):
            try:
                reading = self._exchange(self._urls[request.operation.path], request)
            except _TRANSIENT as exc:
                raise _no_reply(exc, self.timeout_seconds) from exc
        return reading.result()

    def _exchange(self, url: httpx.URL, request: _Request) -> replies.Reading:
        with self.http.stream("POST", url, content=request.body, timeout=self._timeout()) as response:
            reading = self._reading(request, response)
            if reading.wants_body:
                for chunk in response.iter_bytes():  # identity: the bytes as they arrive
                    reading.take(chunk)
                    _check_deadline(response)
        return reading

    def close(self) -> None:
        self.http.close()


class AsyncHttpTransport(_HttpOperations):
    """Asyncio: one ``httpx.AsyncClient`` per client."""

    _http_class = httpx.AsyncClient
    http: httpx.AsyncClient

    async def _post(self, request: _Request) -> Any:
        with deadline.within(self.timeout_seconds):
            left = deadline.remaining_seconds() or 0.0
            try:
                async with asyncio.timeout(max(0.0, left) + _BACKSTOP_GRACE_SECONDS):
                    reading = await self._exchange(self._urls[request.operation.path], request)
            except (*_TRANSIENT, TimeoutError) as exc:
                raise _no_reply(exc, self.timeout_seconds) from exc
        return reading.result()

    async def _exchange(self, url: httpx.URL, request: _Request) -> replies.Reading:
        async with self.http.stream("POST", url, content=request.body, timeout=self._timeout()) as response:
            reading = self._reading(request, response)
            if reading.wants_body:
                async for chunk in response.aiter_bytes():
                    reading.take(chunk)
                    _check_deadline(response)
        return reading

    async def close(self) -> None:
        await self.http.aclose()


def _check_deadline(response: httpx.Response) -> None:
    """Between two pieces of a body: with a transport of the caller's own (whose streams do not
    keep the deadline), a body that trickles in is cut here."""
    left = deadline.remaining_seconds()
    if left is not None and left <= 0:
        raise httpx.ReadTimeout("the call's timeout is spent", request=response.request)
