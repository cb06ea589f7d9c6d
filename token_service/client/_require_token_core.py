"""The request flow of ``@require_token``, once, for Flask, FastAPI and Django.

The adapters (``client/flask.py``, ``fastapi.py``, ``django.py``) only map their
framework's request and response to and from what is decided here, as the
Idempotency-Key middlewares sit on :mod:`._idempotency_core`. What the decorator
answers and keeps is docs/integrations/flask.md's (FastAPI's and Django's pages):

1. :meth:`RequireToken.token_of`: the token, or a 400 (also :meth:`truncated`:
   a body shorter than its Content-Length, before the token is touched).
2. :meth:`RequireToken.begin`: a guard (this request holds the lease, renewed
   while the view runs and its body streams), a :class:`Replay`, or the refusal.
3. The view raised: a ``terminal`` exception is recorded, any other frees the
   token -- unless it is one of the framework's HTTP exceptions (``http_errors``:
   ``abort(404)``, Starlette's ``HTTPException``, ``Http404``): that is the
   response it stands for, rendered by the adapter and settled like one.
4. :meth:`settle` with a :class:`Reply`: the one place that decides what is kept
   (``store_status``; the body when it fits ``max_body_bytes`` raw and
   ``max_result_bytes`` JSON-encoded as the store counts it, else omitted with
   its length). A store that cannot answer is waited out while the lease can be
   held; past that the response does not go out (500 ``outcome_not_recorded``,
   a stream broken off). A streamed body is never buffered whole: :meth:`record`
   passes it through, held up to the caps, and settles it at its end or close.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import time
import weakref
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import Any, TypeVar

from token_service.errors import InvalidRequest, OutcomeNotRecorded, TokenError, TokenInProgress
from token_service.problems import problem_for
from token_service.records import dump_json

from ._engine import Flow, drive, drive_async
from ._fingerprint import body_fingerprint
from ._idempotency_core import Recorder
from ._stored_response import (
    DEFAULT_MAX_RESULT_BYTES,
    DEFAULT_REPLAY_HEADERS,
    StoredResponse,
    StorePolicy,
    default_store_status,
    refusal,
)
from .guard import AsyncGuard, Guard, GuardHookArgs, GuardHooks, Terminal, hooks_of

log = logging.getLogger("token_service.client.require_token")

__all__ = [
    "DEFAULT_WAIT_SECONDS",
    "Replay",
    "Reply",
    "RequireToken",
    "RequireTokenArgs",
    "ValueReply",
    "answer_of",
    "with_options",
]

# How long a duplicate waits for the first request's response by default: a double click's second
# request arrives while the first runs (milliseconds, a payment provider's second or two), and is
# better answered with that response replayed than with a 409 the page must handle.
DEFAULT_WAIT_SECONDS = 2.0
# the weight of the latest run in the typical run time (an exponential moving average)
_LATEST_RUN_WEIGHT = 0.2


@dataclass(frozen=True, slots=True)
class Reply:
    """What a view answered: its status, its headers (all of them) and its body, or only the body's length."""

    status: int
    headers: Sequence[tuple[str, str]]
    body: bytes = b""
    omitted: int | None = None  # the body is not kept: its length


@dataclass(frozen=True, slots=True)
class ValueReply:
    """What a FastAPI endpoint returned: a JSON-able value, rendered again by FastAPI on a replay
    (``status``: the one it set on its injected ``Response``; None: the route's own)."""

    status: int | None
    headers: Sequence[tuple[str, str]]
    value: Any


@dataclass(frozen=True, slots=True)
class Replay:
    """A duplicate: answer the token's stored result."""

    result: Any


def answer_of(outcome: TokenError | Replay) -> Reply:
    """A refusal's problem+json, or a duplicate's stored response marked replayed."""
    if isinstance(outcome, TokenError):
        status, headers, body = problem_for(outcome)
        return Reply(status, list(headers.items()), body)
    replayed = StoredResponse.from_result(outcome.result)
    return Reply(replayed.status, replayed.replay_headers(), replayed.body)


class RequireTokenArgs(GuardHookArgs, total=False):
    """The options every framework's ``@require_token`` takes (``**options``), besides those of its
    own (the request's ``subject`` and ``fingerprint``, ...): each docs/integrations/ page's table."""

    header: str
    replay_headers: Iterable[str]
    lease_seconds: int | None
    terminal: Terminal
    wait_seconds: float
    store_status: StorePolicy
    max_result_bytes: int
    hooks: GuardHooks | None


# their defaults, in the order the decorators' signatures show them
OPTION_DEFAULTS: dict[str, Any] = {
    "header": "Idempotency-Token",
    "replay_headers": DEFAULT_REPLAY_HEADERS,
    "lease_seconds": None,
    "terminal": (),
    "wait_seconds": DEFAULT_WAIT_SECONDS,
    "store_status": default_store_status,
    "max_result_bytes": DEFAULT_MAX_RESULT_BYTES,
    "hooks": None,
}
# what a decorator hands on to its guards unchanged
GUARD_OPTIONS = ("lease_seconds", "terminal", "wait_seconds")
_F = TypeVar("_F", bound=Callable[..., Any])


def with_options(decorator: _F) -> _F:
    """``decorator`` (its shared options in ``**options: Unpack[RequireTokenArgs]``, as type checkers
    read them) with a signature that lists each by keyword with its default, for ``help()`` and
    ``inspect`` (the hooks given by name stay ``**hook_args``)."""
    signature = inspect.signature(decorator)
    *own, rest = signature.parameters.values()
    hints = RequireTokenArgs.__annotations__  # ForwardRefs (this module's annotations are strings)
    shared = [
        inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hints[name].__forward_arg__
        )
        for name, default in OPTION_DEFAULTS.items()
    ]
    parameters = [*own, *shared, rest.replace(name="hook_args", annotation="Unpack[GuardHookArgs]")]
    decorator.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    return decorator


class RequireToken:
    """The options and decisions of one ``@require_token`` (see the module docs)."""

    def __init__(
        self,
        scope: str,
        *,
        header: str = "Idempotency-Token",
        subject: Callable[[Any], Any] | None = None,
        fingerprint: Callable[[Any], Any] | Sequence[str] | None = None,
        replay_headers: Iterable[str] = (),
        max_body_bytes: int | None = None,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        store_status: StorePolicy = default_store_status,
        guard_options: Mapping[str, Any] | None = None,
        http_errors: tuple[type[BaseException], ...] = (),
    ) -> None:
        if isinstance(fingerprint, str):
            raise TypeError("fingerprint fields must be a sequence of names, not one string")
        # body field names, else None (no fingerprint, or a callable given the request)
        self.fields = None if fingerprint is None or callable(fingerprint) else tuple(fingerprint)
        self.scope = scope
        self.header = header
        # callables given the framework's request (FastAPI's may be async)
        self.subject = subject
        self.fingerprint = fingerprint
        self.http_errors = http_errors
        self.replay_headers = frozenset(name.lower() for name in replay_headers)
        self.store_status = store_status
        self.max_result_bytes = max_result_bytes
        # a body longer than max_result_bytes cannot fit once JSON-encoded: never held past it
        self.cap_bytes = max_result_bytes if max_body_bytes is None else min(max_body_bytes, max_result_bytes)
        self.guard_options = dict(guard_options or {})
        # when each running guard of this decorator began (monotonic), and how long its runs
        # typically take: what a duplicate refused 409 token_in_progress is told to wait
        self._started: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        self._typical_seconds: float | None = None

    @classmethod
    def of(
        cls, arguments: Mapping[str, Any], http_errors: tuple[type[BaseException], ...] = ()
    ) -> RequireToken:
        """The core of a decorator from its own arguments (``RequireToken.of(locals(), ...)``, first
        thing: the options are spelled once, in the public signature and ``OPTION_DEFAULTS``)."""
        given = {**OPTION_DEFAULTS, **arguments, **arguments["options"]}
        # the core's own options: what __init__ takes by keyword (no decorator has a guard_options)
        own = {name: given[name] for name in cls.__init__.__kwdefaults__ or () if name in given}
        hand_on = {name: given[name] for name in GUARD_OPTIONS}
        # one GuardHooks, built once and handed to every request's guard as it is (given by name,
        # each guard builds its own: 23.0k instead of 15.9k instructions, 7bf315a); any other
        # name is the decorator's TypeError
        by_name = {name: value for name, value in arguments["options"].items() if name not in OPTION_DEFAULTS}
        hand_on["hooks"] = hooks_of(given["hooks"], by_name)
        return cls(arguments["scope"], **own, guard_options=hand_on, http_errors=http_errors)

    # -- before the view ---------------------------------------------------------------------

    def token_of(self, raw: str | None) -> str | TokenError:
        """The token, or the error to answer (problem+json) without touching it."""
        token = (raw or "").strip()
        if not token:
            return InvalidRequest(f"The {self.header} header is required.", {self.header: ["Missing."]})
        return token

    def identity(self, request: Any, body: Callable[[], bytes], content_type: str | None) -> tuple[Any, Any]:
        """The subject and fingerprint the token must have been issued with (``body()`` read only for
        body fields); what FastAPI's async callables return is awaited by its adapter."""
        subject = self.subject(request) if self.subject else None
        if self.fields is not None:
            return subject, body_fingerprint(body(), content_type, self.fields)
        return subject, self.fingerprint(request) if callable(self.fingerprint) else None

    @staticmethod
    def truncated() -> TokenError:
        return InvalidRequest("The request body ended before its Content-Length.", {"body": ["Incomplete."]})

    # Each step is a flow (client/_engine.py) yielding the guard's calls: begin/settle/raised drive
    # it blocking, abegin/asettle/araised awaiting (Django's adapter drives them inside its own).

    def begin(self, client: Any, token: str, subject: str | None, fingerprint: str | None) -> Any:
        """A guard on the token (this request holds its lease), a :class:`Replay`, or the refusal."""
        return drive(self.beginning(client, token, subject, fingerprint))

    async def abegin(self, client: Any, token: str, subject: str | None, fingerprint: str | None) -> Any:
        return await drive_async(self.beginning(client, token, subject, fingerprint))

    def beginning(
        self, client: Any, token: str, subject: str | None, fingerprint: str | None
    ) -> Flow[Guard | AsyncGuard | Replay | TokenError]:
        try:
            guard = client.guard(
                token, self.scope, subject=subject, fingerprint=fingerprint, **self.guard_options
            )
            fresh = yield guard.start
        except TokenError as exc:
            return self._refusal(exc)
        if not fresh:
            return Replay(guard.result)
        self._started[guard] = time.monotonic()
        return guard  # type: ignore[no-any-return]

    def _ran(self, guard: Any) -> None:
        """A run settled: its time joins the typical one (a moving average; races lose a sample)."""
        started = self._started.pop(guard, None)
        if started is None:
            return
        took = time.monotonic() - started
        typical = self._typical_seconds
        self._typical_seconds = took if typical is None else typical + (took - typical) * _LATEST_RUN_WEIGHT

    def _refusal(self, exc: TokenError) -> TokenError:
        """The refusal to answer; a 409 token_in_progress with a Retry-After that estimates.

        The lease the store reports left is the longest the holder can take, not how long it will
        (a double click got ``Retry-After: 30`` for a run of milliseconds): the estimate is this
        decorator's typical run, in whole seconds (at least 1), never more than the lease has left.
        """
        if not isinstance(exc, TokenInProgress):
            return refusal(exc)
        typical = self._typical_seconds
        estimate = 1 if typical is None else max(1, math.ceil(typical))
        seconds = min(exc.retry_after_seconds, estimate)
        return TokenInProgress(
            f"Another request holds this token; retry in {seconds} s.", retry_after_seconds=seconds
        )

    # -- after the view ----------------------------------------------------------------------

    def answered(self, guard: Guard | AsyncGuard, exc: BaseException) -> bool:
        """Whether the view's exception is the response it stands for (one of the framework's HTTP
        exceptions ``terminal`` does not list), rather than a failure."""
        return isinstance(exc, self.http_errors) and not guard.is_terminal(exc)

    def raised(self, guard: Guard, exc: BaseException, render: Callable[[], Reply | None]) -> None:
        """The view raised ``exc``, which goes on to the framework: an HTTP exception is settled as
        ``render()`` (the framework's response for it; None: the token is freed), any other failed."""
        drive(self.raising(guard, exc, render))

    async def araised(
        self, guard: AsyncGuard, exc: BaseException, render: Callable[[], Awaitable[Reply | None]]
    ) -> None:
        await drive_async(self.raising(guard, exc, render))

    def raising(self, guard: Guard | AsyncGuard, exc: BaseException, render: Callable[[], Any]) -> Flow[None]:
        if self.answered(guard, exc):
            yield from self.settling(guard, (yield render))
        else:
            yield functools.partial(guard.abandon_quietly, exc)

    def settle(self, guard: Guard, reply: Reply | ValueReply | None) -> OutcomeNotRecorded | None:
        """Store what duplicates get, or free the token (``None``: the body broke on its way out).
        Returns the error to answer instead when the outcome could not be recorded; raises no store error."""
        return drive(self.settling(guard, reply))

    async def asettle(self, guard: AsyncGuard, reply: Reply | ValueReply | None) -> OutcomeNotRecorded | None:
        return await drive_async(self.settling(guard, reply))

    def settling(
        self, guard: Guard | AsyncGuard, reply: Reply | ValueReply | None
    ) -> Flow[OutcomeNotRecorded | None]:
        self._ran(guard)
        result = self.result(reply)
        if result is None:
            # a release not recorded: the lease frees it
            yield functools.partial(guard.abandon_quietly, None, retryable=True)
            return None
        try:
            yield functools.partial(guard.succeed, result)
        except OutcomeNotRecorded as exc:
            return self.not_recorded(exc)
        except TokenError as exc:
            # LeaseLost: the view outlived its lease, a duplicate may have run it again
            log.error("could not store the response of a %s request: %s", self.scope, exc)
        return None

    def not_recorded(self, exc: OutcomeNotRecorded) -> OutcomeNotRecorded:
        """The client's answer for an outcome not recorded (the guard logged ``exc``, lease id and
        result, for whoever reconciles it): what a retry gets and the ``token_ref``, never the lease id."""
        return OutcomeNotRecorded(
            "The request ran, but its outcome could not be recorded: the token store did not answer. "
            "Do not send it again as a new request: with this token a retry is refused "
            "(409 token_in_progress) while the request's lease lasts, and may run it again after that.",
            operation=exc.operation,
            scope=exc.scope,
            token_ref=exc.token_ref,
        )

    def result(self, reply: Reply | ValueReply | None) -> dict[str, Any] | None:
        """The token's result for ``reply``, or None: not kept (the token is freed)."""
        if reply is None or not self.store_status(reply.status or 200):
            return None
        kept = [(name, value) for name, value in reply.headers if name.lower() in self.replay_headers]
        if isinstance(reply, ValueReply):
            length = len(dump_json(reply.value))
            document = {"kind": "value", "v": reply.value, "s": reply.status, "h": kept}
            if length <= self.cap_bytes and len(dump_json(document)) <= self.max_result_bytes:
                return document
            return {"kind": "value", "s": reply.status, "h": kept, "omitted": length}
        if reply.omitted is None and len(reply.body) <= self.cap_bytes:
            result = StoredResponse(reply.status, reply.body, kept).to_result()
            # counted the way the store counts it (ASCII-only JSON: a CJK character takes 6 bytes)
            if len(dump_json(result)) <= self.max_result_bytes:
                return result
        omitted = len(reply.body) if reply.omitted is None else reply.omitted
        return StoredResponse(reply.status, b"", kept, omitted=omitted).to_result()

    # -- a streamed body ---------------------------------------------------------------------

    def streamed(self, head: Reply, method: str | None, length: int | None) -> Reply | None:
        """What to settle at once for a streamed answer, or None: :meth:`record` it as it goes out.
        A status not kept frees the token (the body untouched); a HEAD sends no body: omitted."""
        if not self.store_status(head.status):
            return head
        if method == "HEAD":
            return Reply(head.status, head.headers, omitted=length or 0)
        return None

    def record(self, guard: Guard, chunks: Iterable[Any], head: Reply, length: int | None) -> Recording:
        """``chunks`` passed through and recorded; settled at its end or when closed, freed if it raises."""
        recorder = Recorder(head.status, list(head.headers), self.cap_bytes, True, length)
        return Recording(chunks, recorder, lambda failed: self.settle(guard, _reply_of(recorder, failed)))

    def arecord(
        self, guard: AsyncGuard | Guard, chunks: AsyncIterable[Any], head: Reply, length: int | None
    ) -> AsyncRecording:
        recorder = Recorder(head.status, list(head.headers), self.cap_bytes, True, length)

        async def settle(failed: bool) -> OutcomeNotRecorded | None:
            if isinstance(guard, Guard):  # a sync view's async stream (Django serves it on its event loop)
                return self.settle(guard, _reply_of(recorder, failed))
            return await self.asettle(guard, _reply_of(recorder, failed))

        return AsyncRecording(chunks, recorder, settle)


def _reply_of(recorder: Recorder, failed: bool) -> Reply | None:
    """What a recorded stream settles as (failed: None, the token is freed)."""
    stored = None if failed else recorder.stored()
    return None if stored is None else Reply(stored.status, stored.headers, stored.body, stored.omitted)


def _no_close() -> None:
    pass


def _as_bytes(chunk: Any) -> bytes:
    # a streamed view may yield text: the frameworks encode it as UTF-8 after this
    return chunk.encode() if isinstance(chunk, str) else bytes(chunk)


class _Passing:
    """A body on its way out, recorded by ``recorder``, then settled once with ``settle_with``."""

    def __init__(self, chunks: Any, recorder: Recorder, settle: Callable[[bool], Any]) -> None:
        self.chunks = chunks
        self.recorder = recorder
        self.settle_with = settle
        self.settled = False


class Recording(_Passing):
    """A streamed body passed through, recorded, then settled once. An outcome not recorded breaks
    it off (raised before its last bytes, so the server aborts the response) unless closed early."""

    chunks: Iterable[Any]
    settle_with: Callable[[bool], OutcomeNotRecorded | None]

    def __iter__(self) -> Iterator[Any]:
        try:
            for chunk in self.chunks:
                if self.recorder.feed(_as_bytes(chunk)):
                    self._settle(failed=False)  # a body of declared length is whole: record, then send
                yield chunk
        except GeneratorExit:
            raise  # closed early: close() records what went out
        except BaseException:
            self._settle(failed=True)
            raise
        self.recorder.complete = True
        self._settle(failed=False)

    def close(self) -> None:
        try:
            getattr(self.chunks, "close", _no_close)()  # what it wraps may have a close() (PEP 3333)
        finally:
            self._settle(failed=False, breaking=False)

    def _settle(self, *, failed: bool, breaking: bool = True) -> None:
        if not self.settled:
            self.settled = True
            not_recorded = self.settle_with(failed)
            if not_recorded is not None and breaking:
                raise not_recorded


class AsyncRecording(_Passing):
    """:class:`Recording` for an async iterator, settled in a task of its own: a cancelled request
    (anyio cancels every later await in its scope) must still store or free its token."""

    chunks: AsyncIterable[Any]
    settle_with: Callable[[bool], Awaitable[OutcomeNotRecorded | None]]

    async def __aiter__(self) -> AsyncIterator[Any]:
        try:
            async for chunk in self.chunks:
                if self.recorder.feed(_as_bytes(chunk)):
                    await self._settle(failed=False)
                yield chunk
        except (GeneratorExit, asyncio.CancelledError):
            # what went out is recorded: the work is done (nothing more goes out to break off)
            await self._settle(failed=False, breaking=False)
            raise
        except BaseException:
            await self._settle(failed=True)
            raise
        self.recorder.complete = True
        await self._settle(failed=False)

    async def _settle(self, *, failed: bool, breaking: bool = True) -> None:
        if self.settled:
            return
        self.settled = True
        task = asyncio.ensure_future(self.settle_with(failed))
        _SETTLING.add(task)
        task.add_done_callback(_SETTLING.discard)
        not_recorded = await asyncio.shield(task)
        if not_recorded is not None and breaking:
            raise not_recorded


# settling tasks a cancelled request left running (a reference keeps them from being collected)
_SETTLING: set[asyncio.Future[OutcomeNotRecorded | None]] = set()
