"""TokenClient and AsyncTokenClient: one surface over either transport.

The client adds what every caller would otherwise get wrong: a request id on
every consume and begin (generated when the caller gives none), and retries
of transport failures with backoff that resend that SAME id. The Lua scripts
recognise a retry of the request that already won and answer it as a win
(``replayed=True``), so a reply lost on the way back never turns into
``TokenUsed``.

``timeout`` is the budget of the whole call, on both transports: one deadline
on the monotonic clock from the moment of the call, which every attempt,
reconnect, read and back-off spends (:mod:`token_service.deadline`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, Self, TypeVar, Unpack

import redis
import redis.asyncio

from token_service import deadline, defaults
from token_service.errors import ServiceUnavailable, TokenInvalid
from token_service.records import Completed, Consumed, FailRecorded, Finished, Renewed, Started, UseRequest
from token_service.store import AsyncTokenStore, TokenStore
from token_service.tokens import new_request_id

from ._direct import AsyncDirectTransport, DirectLimits, DirectTransport, KeyedRecords, redis_from_url
from ._engine import BeginOptions
from ._extras import install, missing
from ._telemetry import DEFAULT_TELEMETRY, Telemetry
from ._types import IssuedToken, RetryPolicy, TokenInfo
from .guard import AsyncGuard, Guard, GuardOptions, guarded

if TYPE_CHECKING:
    import httpx  # noqa: F401  # named as a string in the clients' bases: optional at run time

__all__ = ["DEFAULT_TIMEOUT_SECONDS", "AsyncTokenClient", "KeyedCalls", "TokenClient", "keyed_calls"]

T = TypeVar("T")
RedisT = TypeVar("RedisT")  # the redis-py client a client runs on: sync or asyncio
HttpTransportT = TypeVar("HttpTransportT")  # the httpx transport it may be given: sync or async
DEFAULT_TIMEOUT_SECONDS = 5.0


class _Transport(Protocol):
    def issue(
        self, scope: str, subject: str | None, fingerprint: str | None, ttl_seconds: int | None, count: int
    ) -> list[IssuedToken]: ...
    def consume(self, use: UseRequest) -> Consumed: ...
    def begin(self, use: UseRequest, lease_seconds: int | None) -> Started | Finished: ...
    def renew(self, token: str, lease_id: str, lease_seconds: int | None) -> Renewed: ...
    def complete(self, token: str, lease_id: str, result: Any) -> Completed: ...
    def fail(self, token: str, lease_id: str, retryable: bool, error: Any) -> FailRecorded: ...
    def inspect(self, token: str) -> TokenInfo: ...
    def revoke(self, token: str) -> None: ...
    def close(self) -> None: ...


class _AsyncTransport(Protocol):
    async def issue(
        self, scope: str, subject: str | None, fingerprint: str | None, ttl_seconds: int | None, count: int
    ) -> list[IssuedToken]: ...
    async def consume(self, use: UseRequest) -> Consumed: ...
    async def begin(self, use: UseRequest, lease_seconds: int | None) -> Started | Finished: ...
    async def renew(self, token: str, lease_id: str, lease_seconds: int | None) -> Renewed: ...
    async def complete(self, token: str, lease_id: str, result: Any) -> Completed: ...
    async def fail(self, token: str, lease_id: str, retryable: bool, error: Any) -> FailRecorded: ...
    async def inspect(self, token: str) -> TokenInfo: ...
    async def revoke(self, token: str) -> None: ...
    async def close(self) -> None: ...


def _policy(retry: RetryPolicy | int | None) -> RetryPolicy:
    if retry is None:
        return RetryPolicy()
    if isinstance(retry, int):
        return RetryPolicy(attempts=retry)
    return retry


class _RevokeAttempts:
    """Around each attempt of one revoke: after an attempt whose reply was lost, TokenInvalid
    means that attempt revoked it (the caller asked for the token to be gone, and it is)."""

    def __init__(self) -> None:
        self.outcome_unknown = False

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if isinstance(exc, ServiceUnavailable):
            self.outcome_unknown = True
        return isinstance(exc, TokenInvalid) and self.outcome_unknown


class _ClientBase(Generic[RedisT, HttpTransportT]):
    """All of a client but the waiting (httpx's ``BaseClient``): its settings, its constructors
    and how each backend is built. :class:`TokenClient` and :class:`AsyncTokenClient` add the
    calls; their redis-py client and httpx transport are the sync or the async kind."""

    _is_async: ClassVar[bool]

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        *,
        retry: RetryPolicy | int | None = None,
        max_connections: int = 20,
        transport: HttpTransportT | None = None,
        telemetry: Telemetry | None = None,
        max_result_bytes: int = defaults.MAX_RESULT_BYTES,
        _backend: Any = None,
        _call_timeout_seconds: float | None = None,
    ) -> None:
        self.retry = _policy(retry)
        self.telemetry = telemetry or DEFAULT_TELEMETRY
        # The budget of one whole call, retries included (None: each attempt has its own timeout)
        self._call_timeout_seconds = _call_timeout_seconds
        self._unanswered = "Redis did not answer"  # the HTTP client says who did not
        if _backend is None:
            _backend = self._over_http(
                base_url, api_key, timeout, max_connections, transport, max_result_bytes
            )
        self._set_backend(_backend, timeout)

    @classmethod
    def from_redis(
        cls,
        url_or_client: str | RedisT,
        *,
        key_prefix: str = defaults.KEY_PREFIX,
        result_ttl_seconds: int = defaults.RESULT_TTL_SECONDS,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        retry: RetryPolicy | int | None = None,
        limits: DirectLimits | None = None,
        telemetry: Telemetry | None = None,
        max_connections: int = defaults.REDIS_MAX_CONNECTIONS,
    ) -> Self:
        """Run the service's Lua scripts on the shared Redis directly (no HTTP hop).

        ``key_prefix`` and ``result_ttl_seconds`` must match the service's
        ``TOKEN_SERVICE_KEY_PREFIX`` / ``RESULT_TTL_SECONDS`` when both are used.
        ``timeout`` bounds each whole call: its attempts, reconnects and back-off
        end within it (a :class:`ServiceUnavailable` then). A client passed in is
        used as it is (its own timeouts and retry settings included: the budget
        then only stops further attempts; the async client cancels at it,
        ``asyncio.timeout``) and not closed by :meth:`close`.
        ``max_connections`` bounds the connections a URL's client opens (per
        node): on one server a call beyond them waits for one within its
        ``timeout``, and (sync) connections unused for a minute are closed.
        """
        backend = cls._over_redis(
            url_or_client, key_prefix, result_ttl_seconds, timeout, limits, max_connections
        )
        return cls(retry=retry, telemetry=telemetry, _backend=backend, _call_timeout_seconds=timeout)

    def _set_backend(self, backend: Any, timeout: float) -> None:
        """The transport; over HTTP (no backend given), ``timeout`` is the whole call's budget."""
        self._backend = backend
        if getattr(backend, "keeps_call_deadline", False):
            self._call_timeout_seconds = timeout
            self._unanswered = "The token service did not answer"

    def _ends_at(self) -> float:
        """The monotonic time a call starting now must be done by (infinity: no budget)."""
        budget = self._call_timeout_seconds
        return math.inf if budget is None else time.monotonic() + budget

    def _retry_delay(self, failures: int, ends_at: float, error: ServiceUnavailable) -> float:
        """The wait before the next attempt; raises ``error`` when there is to be none: the
        attempts are spent, or the next one would start after the call's deadline."""
        if failures >= self.retry.attempts:
            raise error
        delay = self.retry.delay_seconds(failures)
        if time.monotonic() + delay < ends_at:
            return delay
        if time.monotonic() < ends_at:
            raise error  # what the last attempt met: nothing is left to try within the budget
        raise ServiceUnavailable(
            f"{self._unanswered} within the call's timeout ({self._call_timeout_seconds:g} s)."
        ) from error

    def _over_http(
        self,
        base_url: str | None,
        api_key: str | None,
        timeout: float,
        max_connections: int,
        transport: Any,
        max_result_bytes: int,
    ) -> Any:
        """The HTTP transport; ``transport`` is an httpx transport of this client's kind."""
        if base_url is None:
            raise ValueError(f"base_url is required (or use {type(self).__name__}.from_redis)")
        try:
            from . import _http  # httpx is only needed for this transport
        except ModuleNotFoundError as exc:
            missing(exc, f"{type(self).__name__} over HTTP", ("httpx",), install("client"))

        kind = _http.AsyncHttpTransport if self._is_async else _http.HttpTransport
        return kind(
            base_url,
            api_key=api_key,
            timeout=timeout,
            max_connections=max_connections,
            transport=transport,
            max_result_bytes=max_result_bytes,
        )

    @classmethod
    def _over_redis(
        cls,
        url_or_client: Any,  # a URL, or a redis client of the kind the public signature names
        key_prefix: str,
        result_ttl_seconds: int,
        timeout: float,
        limits: DirectLimits | None,
        max_connections: int = defaults.REDIS_MAX_CONNECTIONS,
    ) -> Any:
        """The direct transport: a client passed in is used as it is and not closed with ours."""
        owns = isinstance(url_or_client, str)
        client = (
            redis_from_url(url_or_client, timeout, asyncio=cls._is_async, max_connections=max_connections)
            if owns
            else url_or_client
        )
        limits = limits or DirectLimits()
        if cls._is_async:
            store = AsyncTokenStore(client, key_prefix=key_prefix, result_ttl_seconds=result_ttl_seconds)
            return AsyncDirectTransport(store, limits, owns_client=owns)
        sync_store = TokenStore(client, key_prefix=key_prefix, result_ttl_seconds=result_ttl_seconds)
        return DirectTransport(sync_store, limits, owns_client=owns)


class TokenClient(_ClientBase[redis.Redis, "httpx.BaseTransport"]):
    """The token service for a backend: over HTTP, or straight against Redis (:meth:`from_redis`).

    Every method may raise the :mod:`token_service.errors` class of the
    service's error code; :class:`ServiceUnavailable` only after the retries
    are spent. Use it as a context manager (or call :meth:`close`) to release
    its connections.
    """

    _is_async = False
    _backend: _Transport

    # -- plumbing -----------------------------------------------------------

    def _call(self, operation: Callable[[], T]) -> T:
        """``operation``, tried ``retry.attempts`` times in all while the service is unavailable,
        all within the call's budget (the deadline each Redis step of the attempts keeps to)."""
        budget = self._call_timeout_seconds
        if budget is None:
            return self._attempts(operation, math.inf)
        with deadline.within(budget) as ends_at:
            return self._attempts(operation, ends_at)

    def _attempts(self, operation: Callable[[], T], ends_at: float) -> T:
        failures = 0
        while True:
            try:
                return operation()
            except ServiceUnavailable as error:
                failures += 1
                time.sleep(self._retry_delay(failures, ends_at, error))

    def close(self) -> None:
        self._backend.close()

    def __enter__(self) -> TokenClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- operations ---------------------------------------------------------

    def generate(
        self,
        scope: str,
        *,
        subject: str | None = None,
        fingerprint: str | None = None,
        ttl_seconds: int | None = None,
    ) -> IssuedToken:
        """Issue one token. A retry after a lost reply issues a fresh one (the lost one just expires)."""
        return self._call(lambda: self._backend.issue(scope, subject, fingerprint, ttl_seconds, 1))[0]

    def generate_batch(
        self,
        scope: str,
        count: int,
        *,
        subject: str | None = None,
        fingerprint: str | None = None,
        ttl_seconds: int | None = None,
    ) -> list[IssuedToken]:
        """Issue ``count`` tokens in one round trip."""
        return self._call(lambda: self._backend.issue(scope, subject, fingerprint, ttl_seconds, count))

    def consume(
        self,
        token: str,
        scope: str,
        *,
        subject: str | None = None,
        fingerprint: str | None = None,
        request_id: str | None = None,
    ) -> Consumed:
        """Use a token once. ``replayed`` is true when a retry of this request finds its own win."""
        # every retry resends its request id: a lost win is found again
        use = UseRequest(token, scope, subject, fingerprint, request_id or new_request_id())
        return self._call(lambda: self._backend.consume(use))

    def begin(
        self,
        token: str,
        scope: str,
        *,
        subject: str | None = None,
        fingerprint: str | None = None,
        request_id: str | None = None,
        lease_seconds: int | None = None,
    ) -> Started | Finished:
        """Take a lease (:class:`Started`) or find the stored result (:class:`Finished`)."""
        use = UseRequest(token, scope, subject, fingerprint, request_id or new_request_id())
        return self._call(lambda: self._backend.begin(use, lease_seconds))

    def renew(self, token: str, lease_id: str, *, lease_seconds: int | None = None) -> Renewed:
        """Extend the live lease to ``lease_seconds`` from now; LeaseLost when it is not the live one."""
        return self._call(lambda: self._backend.renew(token, lease_id, lease_seconds))

    def complete(self, token: str, lease_id: str, result: Any = None) -> Completed:
        """Finish a two-phase operation and store its JSON ``result`` for duplicates."""
        return self._call(lambda: self._backend.complete(token, lease_id, result))

    def fail(self, token: str, lease_id: str, *, retryable: bool = True, error: Any = None) -> FailRecorded:
        """Release the token for a retry (``retryable``) or record a terminal failure with ``error``."""
        return self._call(lambda: self._backend.fail(token, lease_id, retryable, error))

    def verify(self, token: str) -> TokenInfo:
        """The token's state and bindings; changes nothing. Raises TokenInvalid when it is gone."""
        return self._call(lambda: self._backend.inspect(token))

    inspect = verify

    def revoke(self, token: str) -> None:
        """Delete a token whatever its state. Raises TokenInvalid when there was none."""
        attempts = _RevokeAttempts()

        def attempt() -> None:
            with attempts:
                self._backend.revoke(token)

        self._call(attempt)

    # -- the two-phase guard --------------------------------------------------

    def guard(self, token: str, scope: str, **options: Unpack[GuardOptions]) -> Guard:
        """A :class:`~token_service.client.guard.Guard` for one token (context manager).

        Options: ``subject``, ``fingerprint``, ``request_id``, ``lease_seconds``,
        ``terminal``, ``wait_seconds``, ``renew``, ``result_type`` and the hooks
        ``on_replay``, ``on_conflict``, ``on_mismatch``, ``on_lease_lost``.
        """
        return Guard(self, token, scope, **options)

    def guarded(self, scope: str, **options: Any) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator form of :meth:`guard`; see :func:`token_service.client.guard.guarded`."""
        return guarded(self, scope, **options)


class AsyncTokenClient(_ClientBase[redis.asyncio.Redis, "httpx.AsyncBaseTransport"]):
    """:class:`TokenClient` for asyncio: the same methods, awaited."""

    _is_async = True
    _backend: _AsyncTransport

    async def _call(self, operation: Callable[[], Awaitable[T]]) -> T:
        budget = self._call_timeout_seconds
        if budget is None:
            return await self._attempts(operation, math.inf)
        with deadline.within(budget) as ends_at:  # the task's own: what the HTTP streams keep to
            return await self._attempts(operation, ends_at)

    async def _attempts(self, operation: Callable[[], Awaitable[T]], ends_at: float) -> T:
        # the HTTP transport keeps the deadline at every read itself: cancelling it at the
        # deadline would race that (and leave connections in httpcore's pool, encode/httpcore#1093)
        cancel = ends_at != math.inf and not getattr(self._backend, "keeps_call_deadline", False)
        failures = 0
        while True:
            try:
                if not cancel:
                    return await operation()
                return await self._before(ends_at, operation)
            except ServiceUnavailable as error:
                failures += 1
                await asyncio.sleep(self._retry_delay(failures, ends_at, error))

    async def _before(self, ends_at: float, operation: Callable[[], Awaitable[T]]) -> T:
        """``operation()``, cancelled at ``ends_at`` (ServiceUnavailable then). redis.asyncio drops
        a connection whose command was cancelled, so no later command reads its reply."""
        budget = asyncio.timeout(ends_at - time.monotonic())
        try:
            async with budget:
                return await operation()
        except TimeoutError as exc:
            if not budget.expired():
                raise
            raise ServiceUnavailable(
                f"{self._unanswered} within the call's timeout ({self._call_timeout_seconds:g} s)."
            ) from exc

    async def close(self) -> None:
        await self._backend.close()

    async def __aenter__(self) -> AsyncTokenClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def generate(
        self,
        scope: str,
        *,
        subject: str | None = None,
        fingerprint: str | None = None,
        ttl_seconds: int | None = None,
    ) -> IssuedToken:
        return (await self._call(lambda: self._backend.issue(scope, subject, fingerprint, ttl_seconds, 1)))[0]

    async def generate_batch(
        self,
        scope: str,
        count: int,
        *,
        subject: str | None = None,
        fingerprint: str | None = None,
        ttl_seconds: int | None = None,
    ) -> list[IssuedToken]:
        return await self._call(lambda: self._backend.issue(scope, subject, fingerprint, ttl_seconds, count))

    async def consume(
        self,
        token: str,
        scope: str,
        *,
        subject: str | None = None,
        fingerprint: str | None = None,
        request_id: str | None = None,
    ) -> Consumed:
        use = UseRequest(token, scope, subject, fingerprint, request_id or new_request_id())
        return await self._call(lambda: self._backend.consume(use))

    async def begin(
        self,
        token: str,
        scope: str,
        *,
        subject: str | None = None,
        fingerprint: str | None = None,
        request_id: str | None = None,
        lease_seconds: int | None = None,
    ) -> Started | Finished:
        use = UseRequest(token, scope, subject, fingerprint, request_id or new_request_id())
        return await self._call(lambda: self._backend.begin(use, lease_seconds))

    async def renew(self, token: str, lease_id: str, *, lease_seconds: int | None = None) -> Renewed:
        return await self._call(lambda: self._backend.renew(token, lease_id, lease_seconds))

    async def complete(self, token: str, lease_id: str, result: Any = None) -> Completed:
        return await self._call(lambda: self._backend.complete(token, lease_id, result))

    async def fail(
        self, token: str, lease_id: str, *, retryable: bool = True, error: Any = None
    ) -> FailRecorded:
        return await self._call(lambda: self._backend.fail(token, lease_id, retryable, error))

    async def verify(self, token: str) -> TokenInfo:
        return await self._call(lambda: self._backend.inspect(token))

    inspect = verify

    async def revoke(self, token: str) -> None:
        attempts = _RevokeAttempts()

        async def attempt() -> None:
            with attempts:
                await self._backend.revoke(token)

        await self._call(attempt)

    def guard(self, token: str, scope: str, **options: Unpack[GuardOptions]) -> AsyncGuard:
        """An :class:`~token_service.client.guard.AsyncGuard` (``async with``)."""
        return AsyncGuard(self, token, scope, **options)

    def guarded(self, scope: str, **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        return guarded(self, scope, **options)


class KeyedCalls:
    """What a guard on a keyed operation calls (its ``GuardClient``): the keyed records of a
    client's direct transport, each call with that client's retries and call budget. Sync or
    async as the client is: its ``_call`` returns the reply, or an awaitable of it."""

    def __init__(self, client: TokenClient | AsyncTokenClient, records: KeyedRecords) -> None:
        self._call = client._call
        self.records = records
        self.telemetry = client.telemetry
        self.is_async = client._is_async

    def begin(self, token: str, scope: str, **options: Unpack[BeginOptions]) -> Any:
        records = self.records
        request_id = options["request_id"] or new_request_id()
        use = records.use(token, scope, options["subject"], options["fingerprint"], request_id)
        lease = records.direct.lease_seconds(options["lease_seconds"])
        return self._call(lambda: records.begin(use, lease))

    def renew(self, token: str, lease_id: str, *, lease_seconds: int | None = None) -> Any:
        return self._call(lambda: self.records.renew(token, lease_id, lease_seconds))

    def complete(self, token: str, lease_id: str, result: Any = None) -> Any:
        return self._call(lambda: self.records.complete(token, lease_id, result))

    def fail(self, token: str, lease_id: str, *, retryable: bool = True, error: Any = None) -> Any:
        return self._call(lambda: self.records.fail(token, lease_id, retryable, error))


def keyed_calls(client: TokenClient | AsyncTokenClient, ttl_seconds: int) -> KeyedCalls:
    """The calls of guards on keyed operations whose unfinished keys live ``ttl_seconds``."""
    backend = getattr(client, "_backend", None)
    if not isinstance(backend, DirectTransport | AsyncDirectTransport):
        raise TypeError(
            "keyed operations run on the direct transport: use TokenClient.from_redis(...) "
            "(or AsyncTokenClient.from_redis) on the service's Redis"
        )
    return KeyedCalls(client, KeyedRecords(backend, ttl_seconds))
