"""The direct transport: the service's own store and Lua scripts on the shared Redis.

No logic of its own: :class:`~token_service.store.TokenStore` runs the
scripts and :mod:`token_service.records` reads their replies, exactly as the
HTTP service does. What the API's schemas would check is checked here
(:mod:`._validate`), because nothing else stands between the caller and Redis.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from token_service import defaults
from token_service.connection import async_client_for, client_for
from token_service.errors import InvalidRequest
from token_service.records import Inspection, IssueRequest, UseRequest, check_payload
from token_service.store import AsyncTokenStore, TokenStore

from . import _validate as check
from ._types import IssuedToken, TokenInfo

__all__ = ["AsyncDirectTransport", "DirectLimits", "DirectTransport", "KeyedRecords", "redis_from_url"]


@dataclass(frozen=True, slots=True)
class DirectLimits:
    """The limits the service would apply (its defaults), enforced client-side."""

    default_ttl_seconds: int = defaults.DEFAULT_TTL_SECONDS
    max_ttl_seconds: int = defaults.MAX_TTL_SECONDS
    default_lease_seconds: int = defaults.DEFAULT_LEASE_SECONDS
    max_lease_seconds: int = defaults.MAX_LEASE_SECONDS
    max_result_bytes: int = defaults.MAX_RESULT_BYTES
    max_batch: int = defaults.MAX_BATCH


def redis_from_url(
    url: str, timeout: float, *, asyncio: bool = False, max_connections: int = defaults.REDIS_MAX_CONNECTIONS
) -> Any:
    """The client the service itself would build for this URL: one server, Sentinel or Cluster,
    with at most ``max_connections`` connections (per node)."""
    if asyncio:
        return async_client_for(url, timeout, max_connections=max_connections)
    return client_for(url, timeout, max_connections=max_connections)


def _issued(request: IssueRequest, tokens: list[str]) -> list[IssuedToken]:
    # Display only, as the HTTP service's expires_at is: no decision of the SDK reads it
    # (the token's life is ttl_seconds, and Redis's PX decides when it ends).
    expires_at = (datetime.now(UTC) + timedelta(seconds=request.ttl_seconds)).replace(microsecond=0)
    return [
        IssuedToken(
            token, request.scope, request.subject, request.fingerprint, request.ttl_seconds, expires_at
        )
        for token in tokens
    ]


def _info(found: Inspection) -> TokenInfo:
    # Display only: this host's clock plus the time Redis says is left, and the lease's end
    # on Redis's clock. Nothing in the SDK compares either with time.time().
    now = datetime.now(UTC)
    lease = found.lease_expires_ms
    return TokenInfo(
        state=found.state,
        scope=found.scope,
        subject=found.subject,
        fingerprint=found.fingerprint,
        expires_at=now + timedelta(milliseconds=found.record_ttl_ms),
        lease_expires_at=datetime.fromtimestamp(lease / 1000, UTC) if lease is not None else None,
        result=found.result,
        error=found.error,
    )


class _Direct:
    """What both direct transports do alike: each call checked as the API's schemas would, then
    the store's own. An async store's call returns its awaitable, which the client awaits."""

    def __init__(
        self, store: TokenStore | AsyncTokenStore, limits: DirectLimits, *, owns_client: bool
    ) -> None:
        self.store = store
        self.limits = limits
        self._owns_client = owns_client

    def issue_request(
        self, scope: str, subject: str | None, fingerprint: str | None, ttl_seconds: int | None, count: int
    ) -> IssueRequest:
        limits = self.limits
        ttl = ttl_seconds if ttl_seconds is not None else limits.default_ttl_seconds
        try:
            check.bounded("count", count, 1, limits.max_batch)
            return IssueRequest(
                check.scope(scope),
                check.text("subject", subject, 128),
                check.text("fingerprint", fingerprint, 128),
                check.bounded("ttl_seconds", ttl, 1, limits.max_ttl_seconds),
            )
        except InvalidRequest:
            check.every(  # one error naming every bad field, as the API's 400
                lambda: check.bounded("count", count, 1, limits.max_batch),
                lambda: check.scope(scope),
                lambda: check.text("subject", subject, 128),
                lambda: check.text("fingerprint", fingerprint, 128),
                lambda: check.bounded("ttl_seconds", ttl, 1, limits.max_ttl_seconds),
            )
            raise

    def use(self, use: UseRequest) -> UseRequest:
        """``use`` itself, once its fields pass the API's rules (InvalidRequest or TokenInvalid)."""
        check.token(use.token)
        try:
            check.scope(use.scope)
            check.text("subject", use.subject, 128)
            check.text("fingerprint", use.fingerprint, 128)
            check.text("request_id", use.request_id, 128)
        except InvalidRequest:
            check.every(
                lambda: check.scope(use.scope),
                lambda: check.text("subject", use.subject, 128),
                lambda: check.text("fingerprint", use.fingerprint, 128),
                lambda: check.text("request_id", use.request_id, 128),
            )
            raise
        return use

    def lease_seconds(self, value: int | None) -> int:
        seconds = value if value is not None else self.limits.default_lease_seconds
        return check.bounded("lease_seconds", seconds, 1, self.limits.max_lease_seconds)

    def lease_id(self, value: str) -> str:
        return check.text("lease_id", value, 64) or ""

    def consume(self, use: UseRequest) -> Any:
        return self.store.consume(self.use(use))

    def begin(self, use: UseRequest, lease_seconds: int | None) -> Any:
        return self.store.begin(self.use(use), self.lease_seconds(lease_seconds))

    def renew(self, token: str, lease_id: str, lease_seconds: int | None) -> Any:
        return self.store.renew(
            check.token(token), self.lease_id(lease_id), self.lease_seconds(lease_seconds)
        )

    def complete(self, token: str, lease_id: str, result: Any) -> Any:
        # the JSON the check made is what the store sends: the result is dumped once here
        stored = check_payload("result", result, self.limits.max_result_bytes)
        return self.store.complete(check.token(token), self.lease_id(lease_id), stored)

    def fail(self, token: str, lease_id: str, retryable: bool, error: Any) -> Any:
        stored = check_payload("error", error, self.limits.max_result_bytes)
        return self.store.fail(check.token(token), self.lease_id(lease_id), retryable=retryable, error=stored)

    def revoke(self, token: str) -> Any:
        return self.store.revoke(check.token(token))


class DirectTransport(_Direct):
    store: TokenStore

    def issue(
        self, scope: str, subject: str | None, fingerprint: str | None, ttl_seconds: int | None, count: int
    ) -> list[IssuedToken]:
        request = self.issue_request(scope, subject, fingerprint, ttl_seconds, count)
        return _issued(request, self.store.issue(request, count))

    def inspect(self, token: str) -> TokenInfo:
        return _info(self.store.inspect(check.token(token)))

    def close(self) -> None:
        if self._owns_client:
            self.store.client.close()


class AsyncDirectTransport(_Direct):
    store: AsyncTokenStore

    async def issue(
        self, scope: str, subject: str | None, fingerprint: str | None, ttl_seconds: int | None, count: int
    ) -> list[IssuedToken]:
        request = self.issue_request(scope, subject, fingerprint, ttl_seconds, count)
        return _issued(request, await self.store.issue(request, count))

    async def inspect(self, token: str) -> TokenInfo:
        return _info(await self.store.inspect(check.token(token)))

    async def close(self) -> None:
        if self._owns_client:
            await self.store.client.aclose()


class KeyedRecords:
    """The direct transport's keyed operations: begin/renew/complete/fail on an ``op:`` record
    (``keyed.operation_token``: a digest of scope and key, never a token), which begin claims
    when absent. One class for both stores: an async store's call returns its awaitable."""

    def __init__(self, direct: _Direct, ttl_seconds: int) -> None:
        check.bounded("ttl_seconds", ttl_seconds, 1, direct.limits.max_ttl_seconds)
        self.direct = direct
        self.store = direct.store
        self.ttl_seconds = ttl_seconds  # how long an absent record is claimed for
        # How long an outcome (or a released key) is kept: the key's ttl_seconds, at least the
        # store's result_ttl_seconds (the claim's lease is its key's expiry: no claim time is left
        # in the record to count from).
        self.keep_seconds = max(ttl_seconds, direct.store.result_ttl_seconds)

    def use(
        self, name: str, scope: str, subject: str | None, fingerprint: str | None, request_id: str
    ) -> UseRequest:
        if subject is not None:
            raise TypeError("a keyed operation has no subject: make it part of the key")
        return UseRequest(
            check.operation(name),
            check.scope(scope),
            None,
            check.text("fingerprint", fingerprint, 128),
            check.text("request_id", request_id, 128),
        )

    def begin(self, use: UseRequest, lease_seconds: int) -> Any:
        return self.store.begin(use, lease_seconds, self.ttl_seconds)

    def renew(self, name: str, lease_id: str, lease_seconds: int | None) -> Any:
        direct = self.direct
        lease = direct.lease_seconds(lease_seconds)
        return self.store.renew(check.operation(name), direct.lease_id(lease_id), lease)

    def complete(self, name: str, lease_id: str, result: Any) -> Any:
        stored = check_payload("result", result, self.direct.limits.max_result_bytes)
        return self.store.complete(
            check.operation(name), self.direct.lease_id(lease_id), stored, self.keep_seconds
        )

    def fail(self, name: str, lease_id: str, retryable: bool, error: Any) -> Any:
        stored = check_payload("error", error, self.direct.limits.max_result_bytes)
        record, lease = check.operation(name), self.direct.lease_id(lease_id)
        return self.store.fail(
            record, lease, retryable=retryable, error=stored, keep_seconds=self.keep_seconds
        )
