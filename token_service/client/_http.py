"""The HTTP transport: the service's JSON API through one pooled httpx client.

Every reply is read as :mod:`._replies` says the contract allows: a problem document
becomes the :mod:`token_service.errors` class of its ``code``, anything the API never
sends :class:`UnexpectedReply`. Transport failures (no connection, timeouts, a connection
dropped before the reply ended) become :class:`ServiceUnavailable`, which the client retries.

The call's deadline (:mod:`token_service.deadline`) bounds every wait: httpx's own timeouts
are per socket operation (a reply trickling in a byte a second never trips them), so the
connection pool's network streams are wrapped to give each connect, read and write only
what is left of the call's budget (:class:`_DeadlineBackend`). Cancelling the request
instead (``asyncio.timeout``) would leave connections behind in httpcore's pool
(encode/httpcore#1093); a read that times out is what the pool already recovers from.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Callable, Iterable
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


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _within(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _within(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        tls = self._stream.start_tls(ssl_context, server_hostname, _within(timeout, httpcore.ConnectTimeout))
        return _DeadlineStream(tls)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's own backend, each stream it opens held to the call's deadline."""

    def __init__(self, backend: httpcore.NetworkBackend) -> None:
        self._backend = backend

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        timeout = _within(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._backend.connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        timeout = _within(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._backend.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class _AsyncDeadlineStream(httpcore.AsyncNetworkStream):
    def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
        self._stream = stream

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._stream.read(max_bytes, _within(timeout, httpcore.ReadTimeout))

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._stream.write(buffer, _within(timeout, httpcore.WriteTimeout))

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        timeout = _within(timeout, httpcore.ConnectTimeout)
        return _AsyncDeadlineStream(await self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _AsyncDeadlineBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, backend: httpcore.AsyncNetworkBackend) -> None:
        self._backend = backend

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        timeout = _within(timeout, httpcore.ConnectTimeout)
        stream = await self._backend.connect_tcp(host, port, timeout, local_address, socket_options)
        return _AsyncDeadlineStream(stream)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        timeout = _within(timeout, httpcore.ConnectTimeout)
        return _AsyncDeadlineStream(await self._backend.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


def _pool_options(limits: httpx.Limits, ssl_context: ssl.SSLContext) -> dict[str, Any]:
    # what httpx.HTTPTransport(limits=limits) gives its pool
    return {
        "ssl_context": ssl_context,
        "max_connections": limits.max_connections,
        "max_keepalive_connections": limits.max_keepalive_connections,
        "keepalive_expiry": limits.keepalive_expiry,
    }


def _sync_transport(limits: httpx.Limits) -> httpx.HTTPTransport:
    """httpx's own transport on a pool whose streams keep the call's deadline.

    httpx has no option for the pool's network backend (encode/httpx#3749 would add one):
    its pool, ``_pool``, is replaced by one built the same way with the backend set.
    ``tests/client/test_call_deadline.py`` fails if a new httpx stops using it."""
    ssl_context = httpx.create_ssl_context(verify=True, trust_env=True)  # httpx's default, built once
    transport = httpx.HTTPTransport(verify=ssl_context, limits=limits)
    transport._pool = httpcore.ConnectionPool(
        **_pool_options(limits, ssl_context), network_backend=_DeadlineBackend(httpcore.SyncBackend())
    )
    return transport


def _async_transport(limits: httpx.Limits) -> httpx.AsyncHTTPTransport:
    ssl_context = httpx.create_ssl_context(verify=True, trust_env=True)
    transport = httpx.AsyncHTTPTransport(verify=ssl_context, limits=limits)
    transport._pool = httpcore.AsyncConnectionPool(
        **_pool_options(limits, ssl_context), network_backend=_AsyncDeadlineBackend(httpcore.AnyIOBackend())
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


def _limits(max_connections: int) -> httpx.Limits:
    return httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)


class _Urls(dict[str, httpx.URL]):
    """Each API path joined to the client's ``base_url`` once, by httpx's own rule.

    httpx parses and merges a relative URL on every request (the largest part
    of building one); an absolute :class:`httpx.URL` is used as it is.
    """

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
    """Each operation once: its path, its JSON body and how its reply is read.

    The two transports below differ only in :meth:`_post`: the sync one
    returns the read reply, the async one a coroutine of it (as redis-py's
    command methods serve both of its clients). So every operation here
    returns ``Any``; ``_client``'s ``_Transport`` and ``_AsyncTransport``
    protocols say what each transport's caller gets.
    """

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
        limits = _limits(max_connections)
        self.http = self._http_class(
            base_url=base_url,
            headers=_headers(api_key),
            timeout=httpx.Timeout(timeout),
            limits=limits,
            transport=transport if transport is not None else self._own_transport(limits),
        )
        self._urls = _Urls(self.http)

    # The client's call holds the deadline (deadline.within its timeout) and, over HTTP,
    # leaves it to this transport to keep: at every read, never by cancelling.
    keeps_call_deadline: ClassVar[bool] = True

    def _own_transport(self, limits: httpx.Limits) -> Any:
        raise NotImplementedError

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
        return replies.Reading(
            request.operation, request.read, url, response.status_code, response.headers, request.cap
        )

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

    def _own_transport(self, limits: httpx.Limits) -> httpx.HTTPTransport:
        return _sync_transport(limits)

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

    def _own_transport(self, limits: httpx.Limits) -> httpx.AsyncHTTPTransport:
        return _async_transport(limits)

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
