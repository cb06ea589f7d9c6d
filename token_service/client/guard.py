"""The two-phase guard: run an operation at most once per token, replay its result to duplicates.

::

    try:
        with client.guard(token, "payment.create") as guard:
            guard.result = charge(card, amount)
        receipt = guard.result
    except Replayed as replay:      # a duplicate: the block did not run
        receipt = replay.result     # the same as the first call's

or ``guard.run(charge, card, amount)``, or the :func:`guarded` decorator.

The ``with`` form cannot run its block on a replay: ``__enter__`` raises
:class:`Replayed` (carrying the stored result) instead of entering it, and a
replayed guard's ``result`` is read-only.

``begin`` either takes a lease or — when the operation already SUCCEEDED —
returns the stored result in the same round trip, and the body does not run.
When the body returns, its result is stored with ``complete``. When it
raises, the token is released for a retry (the default) or, for the
exceptions declared ``terminal``, a terminal failure is recorded: duplicates
then get :class:`~token_service.errors.TokenFailed` carrying the stored error.

Results travel as JSON: the guard hands back the JSON form of the body's
value (tuples become lists), so the first caller and every duplicate see the
same thing.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from token_service.errors import InvalidRequest, PayloadTooLarge, TokenError, TokenInProgress
from token_service.records import Finished, Started, dump_json
from token_service.tokens import new_request_id

if TYPE_CHECKING:
    from ._client import AsyncTokenClient, TokenClient

log = logging.getLogger(__name__)

T = TypeVar("T")
# Which exceptions are terminal failures: a tuple of classes or a predicate.
Terminal = tuple[type[BaseException], ...] | Callable[[BaseException], bool]
_FIRST_POLL_SECONDS = 0.02
_MAX_POLL_SECONDS = 0.25


class Replayed(Exception):
    """``with guard:`` on a token whose operation already succeeded: the block was not run.

    ``result`` is the stored result (what the first caller got). Deliberately
    not a :class:`~token_service.errors.TokenError`, so ``except TokenError``
    does not swallow it by accident.
    """

    def __init__(self, result: Any) -> None:
        super().__init__(
            "the operation already succeeded: its stored result is replayed, the block did not run"
        )
        self.result = result


def describe_error(exc: BaseException) -> dict[str, str]:
    """What a terminal failure stores by default: the exception's class name and message."""
    return {"type": type(exc).__name__, "message": str(exc)}


def as_json(value: Any) -> Any:
    """The JSON form of ``value`` (what a duplicate will be handed back)."""
    return json.loads(dump_json(value))


class _GuardState:
    def __init__(
        self,
        token: str,
        scope: str,
        *,
        subject: str | None,
        fingerprint: str | None,
        request_id: str | None,
        lease_seconds: int | None,
        terminal: Terminal,
        wait_seconds: float,
    ) -> None:
        self.token = token
        self.scope = scope
        self.subject = subject
        self.fingerprint = fingerprint
        # one id for every begin of this guard: a retried begin gets its own lease back
        self.request_id = request_id or new_request_id()
        self.lease_seconds = lease_seconds
        self.terminal = terminal
        self.wait_seconds = wait_seconds
        self.lease: Started | None = None
        self.replayed = False
        self._result: Any = None

    @property
    def result(self) -> Any:
        """The operation's result: set it inside ``with``; the stored one on a replay."""
        return self._result

    @result.setter
    def result(self, value: Any) -> None:
        if self.replayed:
            raise AttributeError("this guard replayed a stored result; its result is read-only")
        self._result = value

    def _begin_options(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "fingerprint": self.fingerprint,
            "request_id": self.request_id,
            "lease_seconds": self.lease_seconds,
        }

    def _took(self, outcome: Started | Finished) -> bool:
        if isinstance(outcome, Finished):
            self.replayed = True
            self._result = outcome.result
            return False
        self.lease = outcome
        return True

    def is_terminal(self, exc: BaseException) -> bool:
        if isinstance(self.terminal, tuple):
            return isinstance(exc, self.terminal)
        return bool(self.terminal(exc))

    @property
    def lease_id(self) -> str:
        if self.lease is None:
            raise RuntimeError("this guard holds no lease")
        return self.lease.lease_id

    def _poll_delay(self, exc: TokenInProgress, delay: float, deadline: float) -> float | None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        return min(delay, exc.retry_after_seconds, remaining)

    def _serialized(self, result: Any) -> Any:
        try:
            return as_json(result)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"a guarded result must be JSON-serializable: {exc}") from exc


class Guard(_GuardState):
    """One token's two-phase operation, on a :class:`TokenClient`. Use once."""

    def __init__(self, client: TokenClient, token: str, scope: str, **options: Any) -> None:
        super().__init__(token, scope, **options)
        self.client = client

    def start(self) -> bool:
        """Begin. True: this caller holds the lease and must run the operation.
        False: it already succeeded; ``result`` holds the stored result.

        Raises TokenInProgress when another holder is live (after waiting up to
        ``wait_seconds`` for it to finish), TokenUsed, TokenFailed, TokenInvalid, ...
        """
        deadline = time.monotonic() + self.wait_seconds
        delay = _FIRST_POLL_SECONDS
        while True:
            try:
                outcome = self.client.begin(self.token, self.scope, **self._begin_options())
            except TokenInProgress as exc:
                pause = self._poll_delay(exc, delay, deadline)
                if pause is None:
                    raise
                time.sleep(pause)
                delay = min(delay * 2, _MAX_POLL_SECONDS)
                continue
            return self._took(outcome)

    def succeed(self, result: Any) -> Any:
        """Store ``result`` (JSON) as the operation's outcome; returns its JSON form."""
        try:
            stored = self._serialized(result)
        except TypeError as exc:
            # the operation ran but its result cannot be stored: never let a duplicate run it again
            self.abandon(exc, retryable=False)
            raise
        try:
            self.client.complete(self.token, self.lease_id, stored)
        except (InvalidRequest, PayloadTooLarge) as exc:
            # The store refused the result (e.g. too large once JSON-encoded). The operation ran:
            # record a terminal failure so the token is never reopened and it never runs twice.
            self.abandon_quietly(exc, retryable=False)
            raise
        self.lease = None
        self._result = stored
        return stored

    def abandon(
        self, exc: BaseException | None = None, *, retryable: bool | None = None, error: Any = None
    ) -> None:
        """End the lease after a failure: release for a retry, or record a terminal failure."""
        if retryable is None:
            retryable = exc is None or not self.is_terminal(exc)
        if error is None and exc is not None and not retryable:
            error = describe_error(exc)
        lease_id = self.lease_id
        self.lease = None
        self.client.fail(self.token, lease_id, retryable=retryable, error=error)

    def abandon_quietly(self, exc: BaseException | None, *, retryable: bool | None = None) -> None:
        """:meth:`abandon`, logging (not raising) a failure to reach the store."""
        try:
            self.abandon(exc, retryable=retryable)
        except TokenError as fail_error:
            # the caller's exception matters more; the lease runs out on its own
            log.warning("could not end the lease after a failure: %s", fail_error)

    def run(self, operation: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``operation`` under the guard and return its (JSON) result, or the stored one."""
        if not self.start():
            return self.result
        try:
            value = operation(*args, **kwargs)
        except BaseException as exc:
            self.abandon_quietly(exc)
            raise
        return self.succeed(value)

    def __enter__(self) -> Guard:
        """Begin; on a replay raise :class:`Replayed` so the block cannot run."""
        if not self.start():
            raise Replayed(self.result)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if self.lease is None:
            return  # a replay, or already settled inside the block
        if exc is None:
            self.succeed(self.result)
        else:
            self.abandon_quietly(exc)


class AsyncGuard(_GuardState):
    """:class:`Guard` for :class:`AsyncTokenClient`; ``async with`` and ``await guard.run(...)``."""

    def __init__(self, client: AsyncTokenClient, token: str, scope: str, **options: Any) -> None:
        super().__init__(token, scope, **options)
        self.client = client

    async def start(self) -> bool:
        deadline = time.monotonic() + self.wait_seconds
        delay = _FIRST_POLL_SECONDS
        while True:
            try:
                outcome = await self.client.begin(self.token, self.scope, **self._begin_options())
            except TokenInProgress as exc:
                pause = self._poll_delay(exc, delay, deadline)
                if pause is None:
                    raise
                await asyncio.sleep(pause)
                delay = min(delay * 2, _MAX_POLL_SECONDS)
                continue
            return self._took(outcome)

    async def succeed(self, result: Any) -> Any:
        try:
            stored = self._serialized(result)
        except TypeError as exc:
            await self.abandon(exc, retryable=False)
            raise
        try:
            await self.client.complete(self.token, self.lease_id, stored)
        except (InvalidRequest, PayloadTooLarge) as exc:
            # as in Guard.succeed: the operation ran, so it must never run again
            await self.abandon_quietly(exc, retryable=False)
            raise
        self.lease = None
        self._result = stored
        return stored

    async def abandon(
        self, exc: BaseException | None = None, *, retryable: bool | None = None, error: Any = None
    ) -> None:
        if retryable is None:
            retryable = exc is None or not self.is_terminal(exc)
        if error is None and exc is not None and not retryable:
            error = describe_error(exc)
        lease_id = self.lease_id
        self.lease = None
        await self.client.fail(self.token, lease_id, retryable=retryable, error=error)

    async def abandon_quietly(self, exc: BaseException | None, *, retryable: bool | None = None) -> None:
        try:
            await self.abandon(exc, retryable=retryable)
        except TokenError as fail_error:
            log.warning("could not end the lease after a failure: %s", fail_error)

    async def run(self, operation: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Await ``operation(*args, **kwargs)`` (a coroutine function) under the guard."""
        if not await self.start():
            return self.result
        try:
            value = await operation(*args, **kwargs)
        except BaseException as exc:
            await self.abandon_quietly(exc)
            raise
        return await self.succeed(value)

    async def __aenter__(self) -> AsyncGuard:
        """Begin; on a replay raise :class:`Replayed` so the block cannot run."""
        if not await self.start():
            raise Replayed(self.result)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if self.lease is None:
            return
        if exc is None:
            await self.succeed(self.result)
        else:
            await self.abandon_quietly(exc)


def guarded(
    client: TokenClient | AsyncTokenClient,
    scope: str,
    *,
    token_arg: str = "token",  # noqa: S107 - a parameter name, not a secret
    subject: str | Callable[..., str | None] | None = None,
    fingerprint: str | Callable[..., str | None] | None = None,
    **guard_options: Any,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a function so each token runs it at most once.

    The token is the decorated function's argument named ``token`` (any
    name: pass ``token_arg="idempotency_token"``). ``subject`` and ``fingerprint``
    are values or callables given the same arguments as the function. Other
    options (``terminal``, ``lease_seconds``, ``wait_seconds``) go to the guard;
    ``request_id`` is refused (every call generates its own).
    A coroutine function needs an :class:`AsyncTokenClient`.
    """
    from ._client import AsyncTokenClient

    if "request_id" in guard_options:
        # one id for every call would make different calls "the same request": both would hold the lease
        raise TypeError(
            "guarded() does not take request_id: each call gets its own request id "
            "(use client.guard(..., request_id=...) to retry one specific call)"
        )

    def pick(value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return value(*args, **kwargs) if callable(value) else value

    def decorate(operation: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(operation)
        if token_arg not in signature.parameters:
            raise TypeError(f"{operation.__qualname__} has no parameter {token_arg!r} to read the token from")
        is_async = inspect.iscoroutinefunction(operation)
        if is_async != isinstance(client, AsyncTokenClient):
            raise TypeError("coroutine functions need an AsyncTokenClient, plain functions a TokenClient")

        def options(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return {
                "token": bound.arguments[token_arg],
                "scope": scope,
                "subject": pick(subject, args, kwargs),
                "fingerprint": pick(fingerprint, args, kwargs),
                **guard_options,
            }

        if is_async:

            @functools.wraps(operation)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                assert isinstance(client, AsyncTokenClient)
                return await client.guard(**options(args, kwargs)).run(operation, *args, **kwargs)

            return run_async

        @functools.wraps(operation)
        def run(*args: Any, **kwargs: Any) -> Any:
            assert not isinstance(client, AsyncTokenClient)
            return client.guard(**options(args, kwargs)).run(operation, *args, **kwargs)

        return run

    return decorate
