"""The HTTP transport: the service's JSON API through one pooled httpx client.

Every reply is read as :mod:`._replies` says the contract allows: a problem document
becomes the :mod:`token_service.errors` class of its ``code``, anything the API never
sends :class:`UnexpectedReply`. Transport failures (no connection, timeouts, a connection
dropped before the reply ended) become :class:`ServiceUnavailable`, which the client retries.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import httpx

from token_service import defaults
from token_service.errors import ServiceUnavailable

from . import _replies as replies

if TYPE_CHECKING:
    from token_service.store import UseRequest

T = TypeVar("T")

# Failures after which nothing is known about what the service did: retry with the same request id.
_TRANSIENT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


def _no_reply(exc: Exception) -> ServiceUnavailable:
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
        *,
        api_key: str | None,
        timeout: float,
        max_connections: int = 20,
        transport: Any = None,  # of the subclass's kind: the public client's signature says which
        max_result_bytes: int = defaults.MAX_RESULT_BYTES,
    ) -> None:
        self.max_result_bytes = max_result_bytes
        self.http = self._http_class(
            base_url=base_url,
            headers=_headers(api_key),
            timeout=httpx.Timeout(timeout),
            limits=_limits(max_connections),
            transport=transport,
        )
        self._urls = _Urls(self.http)

    def _post(self, request: _Request) -> Any:
        raise NotImplementedError

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

    def _post(self, request: _Request) -> Any:
        try:
            reading = self._exchange(self._urls[request.operation.path], request)
        except _TRANSIENT as exc:
            raise _no_reply(exc) from exc
        return reading.result()

    def _exchange(self, url: httpx.URL, request: _Request) -> replies.Reading:
        with self.http.stream("POST", url, content=request.body) as response:
            reading = self._reading(request, response)
            if reading.wants_body:
                for chunk in response.iter_bytes():  # identity: the bytes as they arrive
                    reading.take(chunk)
        return reading

    def close(self) -> None:
        self.http.close()


class AsyncHttpTransport(_HttpOperations):
    """Asyncio: one ``httpx.AsyncClient`` per client."""

    _http_class = httpx.AsyncClient
    http: httpx.AsyncClient

    async def _post(self, request: _Request) -> Any:
        try:
            reading = await self._exchange(self._urls[request.operation.path], request)
        except _TRANSIENT as exc:
            raise _no_reply(exc) from exc
        return reading.result()

    async def _exchange(self, url: httpx.URL, request: _Request) -> replies.Reading:
        async with self.http.stream("POST", url, content=request.body) as response:
            reading = self._reading(request, response)
            if reading.wants_body:
                async for chunk in response.aiter_bytes():
                    reading.take(chunk)
        return reading

    async def close(self) -> None:
        await self.http.aclose()
