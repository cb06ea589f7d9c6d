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

While the body runs, its lease is renewed in the background (every third of
the lease; :mod:`token_service.client._renewal`), so work slower than its lease
still runs once. The lease's length comes from begin's reply and is counted on
the monotonic clock from when begin was sent: no decision reads this host's
wall clock, so a client whose clock is off renews on time all the same. A
lease lost anyway (the process stalled past it, the token was revoked) is
reported through ``on_lease_lost``, the log and the ``lease_losses`` counter,
and ``complete`` is refused: the guard raises
:class:`~token_service.errors.LeaseLost` and the result of whoever took over
stands.

Storing the outcome (``complete``, or ``fail`` after an exception) is tried again,
with back-off, while the store cannot answer and the lease can still be held: its
length from the last begin or renewal Redis acknowledged, on the monotonic clock,
less a margin; the lease is renewed meanwhile. A store back within that changes
nothing the caller sees. Past it, the work has run and its outcome is not recorded:
:class:`~token_service.errors.OutcomeNotRecorded` (never ``ServiceUnavailable``,
which means the work did not run), carrying what a person needs to reconcile. To
the token that is a crashed holder: after the lease a duplicate may run it again
(docs/sdk.md, "When the store goes away as the outcome is stored").

Results are stored as JSON (:mod:`token_service.client._typed_results`); with a
``result_type`` (or the return annotation of the function the guard runs)
they are read back as that type — dataclasses, pydantic models, tuples — so
the first caller and every duplicate get the same typed value. Hooks
``on_replay(guard)``, ``on_conflict(guard, error)`` and ``on_mismatch(guard,
error)`` run when a call is answered without running the body; the four hooks
are one value, :class:`GuardHooks` (``hooks=``), which whatever makes guards
(``@idempotent``, ``@require_token``) builds once and hands on unchanged.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from typing import Any

# The engine's names the integrations import from here, as they always have (``as``: re-exported)
from ._engine import _NO_SPAN, AsyncGuardClient, GuardClient, GuardEngine, drive, drive_async
from ._engine import GuardFactory as GuardFactory
from ._engine import GuardHookArgs as GuardHookArgs
from ._engine import GuardHooks as GuardHooks
from ._engine import GuardOptions as GuardOptions
from ._engine import Terminal as Terminal
from ._engine import as_json as as_json
from ._engine import describe_error as describe_error
from ._engine import hooks_of as hooks_of
from ._renewal import SCHEDULER, AsyncRenewal, Renewal, renew_on_loop
from ._typed_results import return_type

__all__ = ["AsyncGuard", "Guard", "GuardHooks", "Replayed", "describe_error"]


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


class Guard(GuardEngine[GuardClient]):
    """One token's two-phase operation, on a :class:`TokenClient`. Use once.

    The engine (:mod:`._engine`) decides every step; this class only makes the calls."""

    _renewal: Renewal | None = None

    def start(self) -> bool:
        """Begin. True: this caller holds the lease and must run the operation.
        False: it already succeeded; ``result`` holds the stored result.

        Raises TokenInProgress when another holder is live (after waiting up to
        ``wait_seconds`` for it to finish), TokenUsed, TokenFailed, TokenInvalid, ...
        While the lease is held it is renewed in the background (unless ``renew=False``)
        until :meth:`succeed` or :meth:`abandon`.
        """
        return drive(self._starting())

    def _start_renewer(self) -> None:
        # held weakly by the scheduler: a guard dropped unsettled is collected and stops renewing
        self._renewal = SCHEDULER.schedule(self, self._renew_every())

    def _stop_renewer(self) -> None:
        renewal, self._renewal = self._renewal, None
        if renewal is not None:
            # Not waiting for a renewal in flight: the outcome is settled (or given up), and a
            # renewal that lands now is refused by Redis or extends a lease nobody uses.
            renewal.stop(timeout_seconds=0)

    def _renew_lease(self) -> Any:
        sent_at = time.monotonic()
        return self._renewed(
            self.client.renew(self.token, self._held_lease_id, lease_seconds=self.lease_seconds), sent_at
        )

    def succeed(self, result: Any) -> Any:
        """Store ``result`` as the operation's outcome; returns it as duplicates will get it.

        While the store cannot answer, storing is tried again for as long as the lease can be
        held (it is renewed meanwhile); past that, :class:`~token_service.errors.OutcomeNotRecorded`.
        Raises :class:`~token_service.errors.LeaseLost` when the lease was lost
        while the operation ran: nothing is stored (whoever took over keeps theirs).
        """
        return drive(self._succeeding(result))

    def abandon(
        self, exc: BaseException | None = None, *, retryable: bool | None = None, error: Any = None
    ) -> None:
        """End the lease after a failure: release for a retry, or record a terminal failure.

        Tried again while the store cannot answer, as :meth:`succeed` does; past the lease,
        :class:`~token_service.errors.OutcomeNotRecorded` (``operation`` ``release`` or ``fail``).
        """
        drive(self._abandoning(exc, retryable, error))

    def abandon_quietly(self, exc: BaseException | None, *, retryable: bool | None = None) -> None:
        """:meth:`abandon`, logging (not raising) a release the store could not take: the lease
        runs out on its own, which releases the token all the same, later. A terminal failure that
        could not be recorded is raised (:class:`~token_service.errors.OutcomeNotRecorded`): a
        duplicate could run the work again after the lease."""
        drive(self._abandoning_quietly(exc, retryable))

    def run(self, operation: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``operation`` under the guard; return its result, or the stored one.

        Without a ``result_type``, the operation's return annotation says how
        the stored result is read back.
        """
        self._typed_for(operation)
        if not drive(self._starting()):
            return self._result
        span = self._span
        try:
            with span.current() if span is not None else _NO_SPAN:
                value = operation(*args, **kwargs)
        except BaseException as exc:
            drive(self._abandoning_quietly(exc, None))
            raise
        return drive(self._succeeding(value))

    def __enter__(self) -> Guard:
        """Begin; on a replay raise :class:`Replayed` so the block cannot run."""
        if not drive(self._starting()):
            raise Replayed(self._result)
        self._enter_span()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self._exit_span()
        if self.lease is None:
            return  # a replay, or already settled inside the block
        if exc is None:
            drive(self._succeeding(self._result))
        else:
            drive(self._abandoning_quietly(exc, None))


class AsyncGuard(GuardEngine[AsyncGuardClient]):
    """:class:`Guard` for :class:`AsyncTokenClient`; ``async with`` and ``await guard.run(...)``."""

    _is_async = True
    _renewal: AsyncRenewal | None = None

    async def start(self) -> bool:
        return await drive_async(self._starting())

    def _start_renewer(self) -> None:
        # a timer on this loop, holding the guard weakly: dropped unsettled, it stops renewing
        self._renewal = renew_on_loop(self, self._renew_every())

    async def _stop_renewer(self) -> None:
        renewal, self._renewal = self._renewal, None
        if renewal is not None:
            await renewal.stop()

    async def _renew_lease(self) -> Any:
        sent_at = time.monotonic()
        renewed = await self.client.renew(self.token, self._held_lease_id, lease_seconds=self.lease_seconds)
        return self._renewed(renewed, sent_at)

    async def succeed(self, result: Any) -> Any:
        return await drive_async(self._succeeding(result))

    async def abandon(
        self, exc: BaseException | None = None, *, retryable: bool | None = None, error: Any = None
    ) -> None:
        await drive_async(self._abandoning(exc, retryable, error))

    async def abandon_quietly(self, exc: BaseException | None, *, retryable: bool | None = None) -> None:
        await drive_async(self._abandoning_quietly(exc, retryable))

    async def run(self, operation: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Await ``operation(*args, **kwargs)`` (a coroutine function) under the guard."""
        self._typed_for(operation)
        if not await drive_async(self._starting()):
            return self._result
        span = self._span
        try:
            with span.current() if span is not None else _NO_SPAN:
                value = await operation(*args, **kwargs)
        except BaseException as exc:
            await drive_async(self._abandoning_quietly(exc, None))
            raise
        return await drive_async(self._succeeding(value))

    async def __aenter__(self) -> AsyncGuard:
        """Begin; on a replay raise :class:`Replayed` so the block cannot run."""
        if not await drive_async(self._starting()):
            raise Replayed(self._result)
        self._enter_span()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        self._exit_span()
        if self.lease is None:
            return
        if exc is None:
            await drive_async(self._succeeding(self._result))
        else:
            await drive_async(self._abandoning_quietly(exc, None))


def guarded(
    client: GuardFactory,
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
    if "request_id" in guard_options:
        # one id for every call would make different calls "the same request": both would hold the lease
        raise TypeError(
            "guarded() does not take request_id: each call gets its own request id "
            "(use client.guard(..., request_id=...) to retry one specific call)"
        )

    # the hooks, once: each call's guard gets the one value, not four arguments to fold again
    hook_args = {name: guard_options.pop(name) for name in GuardHooks._fields if name in guard_options}
    if hook_args or "hooks" in guard_options:
        guard_options["hooks"] = hooks_of(guard_options.get("hooks"), hook_args)

    def pick(value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return value(*args, **kwargs) if callable(value) else value

    def decorate(operation: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(operation)
        if token_arg not in signature.parameters:
            raise TypeError(f"{operation.__qualname__} has no parameter {token_arg!r} to read the token from")
        is_async = inspect.iscoroutinefunction(operation)
        if is_async != inspect.iscoroutinefunction(client.begin):
            raise TypeError("coroutine functions need an AsyncTokenClient, plain functions a TokenClient")
        typed = {"result_type": guard_options.get("result_type") or return_type(operation)}

        def options(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return {
                "token": bound.arguments[token_arg],
                "scope": scope,
                "subject": pick(subject, args, kwargs),
                "fingerprint": pick(fingerprint, args, kwargs),
                **guard_options,
                **typed,
            }

        if is_async:

            @functools.wraps(operation)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                guard: AsyncGuard = client.guard(**options(args, kwargs))
                return await guard.run(operation, *args, **kwargs)

            return run_async

        @functools.wraps(operation)
        def run(*args: Any, **kwargs: Any) -> Any:
            guard: Guard = client.guard(**options(args, kwargs))
            return guard.run(operation, *args, **kwargs)

        return run

    return decorate
