"""TokenClient and AsyncTokenClient: one surface over either transport, each method written once.

What every caller would otherwise get wrong: a request id on every consume and begin, resent
by every retry (a lost win is answered as one, ``replayed=True``, never ``TokenUsed``), and
``timeout`` as the budget of the whole call (docs/sdk.md, "Timeouts: one budget per call").
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Concatenate,
    Generic,
    ParamSpec,
    Protocol,
    Self,
    TypeVar,
    Unpack,
    overload,
)

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
P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C")
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


if TYPE_CHECKING:

    class _Method(Generic[P, R]):
        """A method written once in :class:`_ClientBase`, awaited on :class:`AsyncTokenClient`."""

        @overload
        def __get__(self, client: AsyncTokenClient, owner: object) -> Callable[P, Coroutine[Any, Any, R]]: ...
        @overload
        def __get__(self, client: object, owner: object) -> Callable[P, R]: ...
        def __get__(self, client: object, owner: object) -> Any: ...

    def _method(function: Callable[Concatenate[Any, P], R]) -> _Method[P, R]: ...
else:

    def _method(function):
        function.awaited_on_async = True
        return function


def _awaiting(cls: type[C]) -> type[C]:
    """The async client: each shared method as a coroutine function awaiting its reply (what
    ``guarded`` and every ``inspect.iscoroutinefunction`` caller looks for)."""

    def awaited(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(method)
        async def call(*args: Any, **kwargs: Any) -> Any:
            return await method(*args, **kwargs)

        return call

    for name, method in vars(_ClientBase).items():
        if getattr(method, "awaited_on_async", False):
            setattr(cls, name, awaited(method))
    return cls


def _policy(retry: RetryPolicy | int | None) -> RetryPolicy:
    if retry is None:
        return RetryPolicy()
    if isinstance(retry, int):
        return RetryPolicy(attempts=retry)
    return retry


class _ClientBase(Generic[RedisT, HttpTransportT]):
    """All of a client but the waiting (httpx's ``BaseClient``): its settings, its constructors
    and how each backend is built. :class:`TokenClient` and :class:`AsyncTokenClient` add the
    calls; their redis-py client and httpx transport are the sync or the async kind."""

    _is_async: ClassVar[bool]
    _backend: _Transport  # or, on the async client, the same methods returning awaitables

    if TYPE_CHECKING:  # as the sync client has them; the async one's are coroutine functions

        def _call(self, operation: Callable[..., T], *args: Any) -> T: ...
        def _first(self, tokens: list[IssuedToken]) -> IssuedToken: ...
        def guard(self, token: str, scope: str, **options: Unpack[GuardOptions]) -> Guard | AsyncGuard: ...

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
            if base_url is None:
                raise ValueError(f"base_url is required (or use {type(self).__name__}.from_redis)")
            try:
                from . import _http  # httpx is only needed for this transport
            except ModuleNotFoundError as exc:
                missing(exc, f"{type(self).__name__} over HTTP", ("httpx",), install("client"))
            kind = _http.AsyncHttpTransport if self._is_async else _http.HttpTransport
            _backend = kind(base_url, api_key, timeout, max_connections, transport, max_result_bytes)
            # over HTTP, ``timeout`` is the budget of the whole call too
            self._call_timeout_seconds = timeout
            self._unanswered = "The token service did not answer"
        self._backend = _backend

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

        ``key_prefix`` and ``result_ttl_seconds`` must match the service's settings. ``timeout``
        bounds each whole call; a client passed in keeps its own timeouts and is not closed by
        :meth:`close` (docs/sdk.md, "Timeouts"). ``max_connections``: per node, for a URL.
        """
        client: Any = url_or_client  # a client passed in is used as it is, and not closed with ours
        owns = isinstance(url_or_client, str)
        if isinstance(url_or_client, str):
            client = redis_from_url(
                url_or_client, timeout, asyncio=cls._is_async, max_connections=max_connections
            )
        store = (AsyncTokenStore if cls._is_async else TokenStore)(
            client, key_prefix=key_prefix, result_ttl_seconds=result_ttl_seconds
        )
        direct = AsyncDirectTransport if cls._is_async else DirectTransport
        backend = direct(store, limits or DirectLimits(), owns_client=owns)
        return cls(retry=retry, telemetry=telemetry, _backend=backend, _call_timeout_seconds=timeout)

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

    # -- the operations: written once, awaited on the async client ---------------------------

    @_method
    def generate(
        self,
        scope: str,
        *,
        subject: str | None = None,
        fingerprint: str | None = None,
        ttl_seconds: int | None = None,
    ) -> IssuedToken:
        """Issue one token. A retry after a lost reply issues a fresh one (the lost one just expires)."""
        return self._first(self._call(self._backend.issue, scope, subject, fingerprint, ttl_seconds, 1))

    @_method
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
        return self._call(self._backend.issue, scope, subject, fingerprint, ttl_seconds, count)

    @_method
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
        return self._call(self._backend.consume, use)

    @_method
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
        return self._call(self._backend.begin, use, lease_seconds)

    @_method
    def renew(self, token: str, lease_id: str, *, lease_seconds: int | None = None) -> Renewed:
        """Extend the live lease to ``lease_seconds`` from now; LeaseLost when it is not the live one."""
        return self._call(self._backend.renew, token, lease_id, lease_seconds)

    @_method
    def complete(self, token: str, lease_id: str, result: Any = None) -> Completed:
        """Finish a two-phase operation and store its JSON ``result`` for duplicates."""
        return self._call(self._backend.complete, token, lease_id, result)

    @_method
    def fail(self, token: str, lease_id: str, *, retryable: bool = True, error: Any = None) -> FailRecorded:
        """Release the token for a retry (``retryable``) or record a terminal failure with ``error``."""
        return self._call(self._backend.fail, token, lease_id, retryable, error)

    @_method
    def verify(self, token: str) -> TokenInfo:
        """The token's state and bindings; changes nothing. Raises TokenInvalid when it is gone."""
        return self._call(self._backend.inspect, token)

    inspect = verify

    @_method
    def revoke(self, token: str) -> None:
        """Delete a token whatever its state. Raises TokenInvalid when there was none.

        After an attempt whose reply was lost, TokenInvalid means that attempt revoked it:
        the caller asked for the token to be gone, and it is (``_attempts``)."""
        return self._call(self._backend.revoke, token)

    def guarded(self, scope: str, **options: Any) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator form of :meth:`guard`; see :func:`token_service.client.guard.guarded`."""
        return guarded(self, scope, **options)


class TokenClient(_ClientBase[redis.Redis, "httpx.BaseTransport"]):
    """The token service for a backend: over HTTP, or straight against Redis (:meth:`from_redis`).

    Every method may raise the :mod:`token_service.errors` class of the
    service's error code; :class:`ServiceUnavailable` only after the retries
    are spent. Use it as a context manager (or call :meth:`close`) to release
    its connections.
    """

    _is_async = False

    def _call(self, operation: Callable[..., T], *args: Any) -> T:
        """``operation(*args)``, tried ``retry.attempts`` times in all while the service is
        unavailable, all within the call's budget (the deadline each Redis step keeps to)."""
        budget = self._call_timeout_seconds
        if budget is None:
            return self._attempts(math.inf, operation, args)
        with deadline.within(budget) as ends_at:
            return self._attempts(ends_at, operation, args)

    def _attempts(self, ends_at: float, operation: Callable[..., T], args: tuple[Any, ...]) -> T:
        failures = 0
        while True:
            try:
                return operation(*args)
            except ServiceUnavailable as error:
                failures += 1
                time.sleep(self._retry_delay(failures, ends_at, error))
            except TokenInvalid:
                if not failures or operation != self._backend.revoke:
                    raise
                return None  # type: ignore[return-value]  # see _ClientBase.revoke

    @staticmethod
    def _first(tokens: list[IssuedToken]) -> IssuedToken:
        return tokens[0]

    def close(self) -> None:
        self._backend.close()

    def __enter__(self) -> TokenClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def guard(self, token: str, scope: str, **options: Unpack[GuardOptions]) -> Guard:
        """A :class:`~token_service.client.guard.Guard` for one token (context manager); its
        options are :class:`~token_service.client.guard.GuardOptions` (docs/sdk.md)."""
        return Guard(self, token, scope, **options)


@_awaiting
class AsyncTokenClient(_ClientBase[redis.asyncio.Redis, "httpx.AsyncBaseTransport"]):
    """:class:`TokenClient` for asyncio: the same methods, awaited."""

    _is_async = True
    _backend: Any  # _Transport's methods, each returning an awaitable

    async def _call(self, operation: Callable[..., Awaitable[T]], *args: Any) -> T:  # type: ignore[override]
        budget = self._call_timeout_seconds
        if budget is None:
            return await self._attempts(math.inf, operation, args)
        with deadline.within(budget) as ends_at:  # the task's own: what the HTTP streams keep to
            return await self._attempts(ends_at, operation, args)

    async def _attempts(
        self, ends_at: float, operation: Callable[..., Awaitable[T]], args: tuple[Any, ...]
    ) -> T:
        # the HTTP transport keeps the deadline at every read itself: cancelling it at the
        # deadline would race that (and leave connections in httpcore's pool, encode/httpcore#1093)
        cancel = ends_at != math.inf and not getattr(self._backend, "keeps_call_deadline", False)
        failures = 0
        while True:
            try:
                if not cancel:
                    return await operation(*args)
                return await self._before(ends_at, operation(*args))
            except ServiceUnavailable as error:
                failures += 1
                await asyncio.sleep(self._retry_delay(failures, ends_at, error))
            except TokenInvalid:
                if not failures or operation != self._backend.revoke:
                    raise
                return None  # type: ignore[return-value]  # see _ClientBase.revoke

    async def _before(self, ends_at: float, reply: Awaitable[T]) -> T:
        """``reply``, cancelled at ``ends_at`` (ServiceUnavailable then). redis.asyncio drops
        a connection whose command was cancelled, so no later command reads its reply."""
        budget = asyncio.timeout(ends_at - time.monotonic())
        try:
            async with budget:
                return await reply
        except TimeoutError as exc:
            if not budget.expired():
                raise
            raise ServiceUnavailable(
                f"{self._unanswered} within the call's timeout ({self._call_timeout_seconds:g} s)."
            ) from exc

    async def _first(self, tokens: Awaitable[list[IssuedToken]]) -> IssuedToken:  # type: ignore[override]
        return (await tokens)[0]

    async def close(self) -> None:
        await self._backend.close()

    async def __aenter__(self) -> AsyncTokenClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def guard(self, token: str, scope: str, **options: Unpack[GuardOptions]) -> AsyncGuard:
        """An :class:`~token_service.client.guard.AsyncGuard` (``async with``)."""
        return AsyncGuard(self, token, scope, **options)


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
        return self._call(records.begin, use, lease)

    def renew(self, token: str, lease_id: str, *, lease_seconds: int | None = None) -> Any:
        return self._call(self.records.renew, token, lease_id, lease_seconds)

    def complete(self, token: str, lease_id: str, result: Any = None) -> Any:
        return self._call(self.records.complete, token, lease_id, result)

    def fail(self, token: str, lease_id: str, *, retryable: bool = True, error: Any = None) -> Any:
        return self._call(self.records.fail, token, lease_id, retryable, error)


def keyed_calls(client: TokenClient | AsyncTokenClient, ttl_seconds: int) -> KeyedCalls:
    """The calls of guards on keyed operations whose unfinished keys live ``ttl_seconds``."""
    backend = getattr(client, "_backend", None)
    if not isinstance(backend, DirectTransport | AsyncDirectTransport):
        raise TypeError(
            "keyed operations run on the direct transport: use TokenClient.from_redis(...) "
            "(or AsyncTokenClient.from_redis) on the service's Redis"
        )
    return KeyedCalls(client, KeyedRecords(backend, ttl_seconds))
