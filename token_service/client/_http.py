"""The HTTP transport: the service's JSON API through one pooled httpx client.

Every error the service answers with is problem+json carrying a stable
``code``; it becomes the :mod:`token_service.errors` class of that code, with
``Retry-After`` and the stored ``error`` on it. Transport failures (no
connection, timeouts, a connection dropped before the reply) become
:class:`ServiceUnavailable`, which the client retries.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import httpx

from token_service.errors import (
    ERRORS_BY_CODE,
    InvalidRequest,
    PayloadTooLarge,
    RateLimited,
    ServiceUnavailable,
    TokenError,
    Unauthorized,
)
from token_service.records import Completed, Consumed, FailRecorded, Finished, Renewed, Started
from token_service.tokens import whole_number

from ._types import IssuedToken, TokenInfo

if TYPE_CHECKING:
    from token_service.store import UseRequest

T = TypeVar("T")

_BY_STATUS: dict[int, type[TokenError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    413: PayloadTooLarge,
    429: RateLimited,
    502: ServiceUnavailable,
    503: ServiceUnavailable,
    504: ServiceUnavailable,
}
# Failures after which nothing is known about what the service did: retry with the same request id.
_TRANSIENT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


_TOKEN_REF = re.compile(r"[A-Za-z0-9_-]{22}")


def _datetime(value: str) -> datetime:
    return datetime.fromisoformat(value).astimezone(UTC)


def error_from_response(response: httpx.Response) -> TokenError:
    """The exception an error response stands for (its problem+json ``code`` decides)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {}
    code = body.get("code")
    cls = ERRORS_BY_CODE.get(code) if isinstance(code, str) else None
    if cls is None:
        cls = _BY_STATUS.get(response.status_code)
    detail = body.get("detail") if isinstance(body.get("detail"), str) else None
    if cls is None:
        return TokenError(
            f"Unexpected HTTP {response.status_code} ({code or 'no code'}): {detail or ''}".strip()
        )
    # the header first (a proxy may answer without a document); a date or anything else: the document's
    retry_after = whole_number(response.headers.get("Retry-After", ""), max_digits=9)
    if retry_after is not None:
        body["retry_after_seconds"] = max(1, retry_after)
    error = cls.from_problem(detail, body)
    token_ref = body.get("token_ref")
    if isinstance(token_ref, str) and _TOKEN_REF.fullmatch(token_ref):
        error.token_ref = token_ref  # for the caller's logs: the operators find the record by it
    return error


def _encode(body: dict[str, Any]) -> bytes:
    """The JSON body without its None fields, byte for byte what httpx's ``json=`` would send."""
    present = {key: value for key, value in body.items() if value is not None}
    return json.dumps(present, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _issued(item: dict[str, Any]) -> IssuedToken:
    return IssuedToken(
        token=item["token"],
        scope=item["scope"],
        subject=item.get("subject"),
        fingerprint=item.get("fingerprint"),
        ttl_seconds=item["ttl_seconds"],
        expires_at=_datetime(item["expires_at"]),
    )


def _begun(body: dict[str, Any]) -> Started | Finished:
    if body["outcome"] == "succeeded":
        return Finished(result=body.get("result"))
    lease_expires = _datetime(body["lease_expires_at"])
    return Started(
        lease_id=body["lease_id"],
        lease_expires_ms=int(lease_expires.timestamp() * 1000),
        replayed=bool(body.get("replayed", False)),
        lease_seconds=_lease_seconds(body),
    )


def _renewed(body: dict[str, Any]) -> Renewed:
    return Renewed(
        lease_expires_ms=int(_datetime(body["lease_expires_at"]).timestamp() * 1000),
        lease_seconds=_lease_seconds(body),
    )


def _lease_seconds(body: dict[str, Any]) -> float | None:
    """How long the lease runs from the service's answer; None from a service too old to say
    (the guard never falls back on ``lease_expires_at``: that is the service's clock, not ours)."""
    value = body.get("lease_seconds")
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 86400 * 366:
        return None
    return float(value)


def _info(body: dict[str, Any]) -> TokenInfo:
    lease = body.get("lease_expires_at")
    return TokenInfo(
        state=body["state"],
        scope=body["scope"],
        subject=body.get("subject"),
        fingerprint=body.get("fingerprint"),
        expires_at=_datetime(body["expires_at"]),
        lease_expires_at=_datetime(lease) if lease else None,
        result=body.get("result"),
        error=body.get("error"),
    )


def _headers(api_key: str | None) -> dict[str, str]:
    # Every request is a POST of a JSON body (encoded by _encode, so httpx does not add the type).
    headers = {"Accept": "application/json, application/problem+json", "Content-Type": "application/json"}
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


def _answer(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise error_from_response(response)
    return response.json()


def _no_reply(exc: Exception) -> ServiceUnavailable:
    return ServiceUnavailable(f"No reply from the token service: {type(exc).__name__}.")


def _use(use: UseRequest) -> dict[str, Any]:
    """The body of a request that uses a token (consume, and begin with its lease)."""
    return {
        "token": use.token,
        "scope": use.scope,
        "subject": use.subject,
        "fingerprint": use.fingerprint,
        "request_id": use.request_id,
    }


def _consumed(reply: Any) -> Consumed:
    return Consumed(replayed=bool(reply["replayed"]))


def _completed(reply: Any) -> Completed:
    return Completed(replayed=bool(reply.get("replayed", False)))


def _fail_recorded(reply: Any) -> FailRecorded:
    return FailRecorded(outcome=reply["outcome"], replayed=bool(reply.get("replayed", False)))


def _issued_batch(reply: Any) -> list[IssuedToken]:
    return [_issued(item) for item in reply["tokens"]]


def _issued_one(reply: Any) -> list[IssuedToken]:
    return [_issued(reply)]


def _nothing(reply: Any) -> None:
    return None


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
    ) -> None:
        self.http = self._http_class(
            base_url=base_url,
            headers=_headers(api_key),
            timeout=httpx.Timeout(timeout),
            limits=_limits(max_connections),
            transport=transport,
        )
        self._urls = _Urls(self.http)

    def _post(self, path: str, body: dict[str, Any], read: Callable[[Any], Any]) -> Any:
        raise NotImplementedError

    def issue(
        self, scope: str, subject: str | None, fingerprint: str | None, ttl_seconds: int | None, count: int
    ) -> Any:
        body = {"scope": scope, "subject": subject, "fingerprint": fingerprint, "ttl_seconds": ttl_seconds}
        if count == 1:
            return self._post("/token/generate", body, _issued_one)
        return self._post("/token/generate/batch", {**body, "count": count}, _issued_batch)

    def consume(self, use: UseRequest) -> Any:
        return self._post("/token/consume", _use(use), _consumed)

    def begin(self, use: UseRequest, lease_seconds: int | None) -> Any:
        body = _use(use)
        body["lease_seconds"] = lease_seconds
        return self._post("/token/begin", body, _begun)

    def renew(self, token: str, lease_id: str, lease_seconds: int | None) -> Any:
        body = {"token": token, "lease_id": lease_id, "lease_seconds": lease_seconds}
        return self._post("/token/renew", body, _renewed)

    def complete(self, token: str, lease_id: str, result: Any) -> Any:
        return self._post(
            "/token/complete", {"token": token, "lease_id": lease_id, "result": result}, _completed
        )

    def fail(self, token: str, lease_id: str, retryable: bool, error: Any) -> Any:
        body = {"token": token, "lease_id": lease_id, "retryable": retryable, "error": error}
        return self._post("/token/fail", body, _fail_recorded)

    def inspect(self, token: str) -> Any:
        return self._post("/token/inspect", {"token": token}, _info)

    def revoke(self, token: str) -> Any:
        return self._post("/token/revoke", {"token": token}, _nothing)


class HttpTransport(_HttpOperations):
    """Sync: one ``httpx.Client`` (a connection pool) per client."""

    _http_class = httpx.Client
    http: httpx.Client

    def _post(self, path: str, body: dict[str, Any], read: Callable[[Any], T]) -> T:
        try:
            response = self.http.post(self._urls[path], content=_encode(body))
        except _TRANSIENT as exc:
            raise _no_reply(exc) from exc
        return read(_answer(response))

    def close(self) -> None:
        self.http.close()


class AsyncHttpTransport(_HttpOperations):
    """Asyncio: one ``httpx.AsyncClient`` per client."""

    _http_class = httpx.AsyncClient
    http: httpx.AsyncClient

    async def _post(self, path: str, body: dict[str, Any], read: Callable[[Any], T]) -> T:
        try:
            response = await self.http.post(self._urls[path], content=_encode(body))
        except _TRANSIENT as exc:
            raise _no_reply(exc) from exc
        return read(_answer(response))

    async def close(self) -> None:
        await self.http.aclose()
