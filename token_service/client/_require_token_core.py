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
from typing import Any, cast

from token_service.errors import InvalidRequest, OutcomeNotRecorded, TokenError, TokenInProgress
from token_service.problems import problem_for
from token_service.records import dump_json

from ._engine import Flow, drive, drive_async
from ._fingerprint import body_fingerprint
from ._idempotency_core import Recorder
from ._stored_response import (
    DEFAULT_MAX_RESULT_BYTES,
    StoredResponse,
    StorePolicy,
    default_store_status,
    refusal,
)
from .guard import AsyncGuard, Guard, hooks_of

log = logging.getLogger("token_service.client.require_token")

__all__ = [
    "DEFAULT_WAIT_SECONDS",
    "Replay",
    "Reply",
    "RequireToken",
    "ValueReply",
    "answer_of",
]

# How long a duplicate waits for the first request's response by default. A double click's
# second request arrives while the first still runs, which usually takes milliseconds, at most
# a payment provider's second or two: waiting that long answers it with the first response
# (replayed) instead of a 409 the shopper's page must handle. A worker (a greenlet under gevent)
# is held that long at most; wait_seconds=0 refuses at once.
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
    """What a FastAPI endpoint returned: a JSON-able value, rendered again by FastAPI on a replay.

    ``status`` is the one it set on its injected ``Response`` (None: the route's own)."""

    status: int | None
    headers: Sequence[tuple[str, str]]
    value: Any


@dataclass(frozen=True, slots=True)
class Replay:
    """A duplicate: answer the token's stored result."""

    result: Any


def answer_of(outcome: TokenError | Replay) -> Reply:
    """What a refused request gets (its problem+json) or a duplicate (the stored response, marked
    replayed): each adapter only turns it into its framework's response."""
    if isinstance(outcome, TokenError):
        status, headers, body = problem_for(outcome)
        return Reply(status, list(headers.items()), body)
    replayed = StoredResponse.from_result(outcome.result)
    return Reply(replayed.status, replayed.replay_headers(), replayed.body)


def _fingerprint_fields(spec: Any) -> Sequence[str] | None:
    """The body field names of ``fingerprint=[...]``, or None (no fingerprint, or a callable)."""
    if spec is None or callable(spec):
        return None
    if isinstance(spec, str):
        raise TypeError("fingerprint fields must be a sequence of names, not one string")
    return tuple(spec)


# what a decorator hands on to its guards unchanged (the guard's own options and hooks)
GUARD_OPTIONS = (
    "lease_seconds",
    "terminal",
    "wait_seconds",
)
_OWN_OPTIONS = (
    "header",
    "subject",
    "fingerprint",
    "replay_headers",
    "max_body_bytes",
    "max_result_bytes",
    "store_status",
)


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
        # body field names (checked first: one string is a TypeError), else None
        self.fields = _fingerprint_fields(fingerprint)
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
        """The core of a decorator from its own arguments: ``RequireToken.of(locals(), ...)`` first
        thing in ``require_token``, so the options are spelled once, in the public signature;
        ``http_errors``: its framework's exceptions that stand for a response (step 3)."""
        own = {name: arguments[name] for name in _OWN_OPTIONS if name in arguments}
        hand_on = {name: arguments[name] for name in GUARD_OPTIONS if name in arguments}
        # the hooks (hooks= and **hook_args): one GuardHooks, built here once and handed to every
        # request's guard as it is (given by name, each guard builds its own: 23.0k instead of 15.9k
        # instructions, 7bf315a); a name that is no hook is the decorator's TypeError
        hand_on["hooks"] = hooks_of(arguments.get("hooks"), arguments.get("hook_args") or {})
        return cls(arguments["scope"], **own, guard_options=hand_on, http_errors=http_errors)

    # -- before the view ---------------------------------------------------------------------

    def token_of(self, raw: str | None) -> str | TokenError:
        """The token, or the error to answer (problem+json) without touching it."""
        token = (raw or "").strip()
        if not token:
            return InvalidRequest(f"The {self.header} header is required.", {self.header: ["Missing."]})
        return token

    def identity(self, request: Any, body: Callable[[], bytes], content_type: str | None) -> tuple[Any, Any]:
        """The request's subject and fingerprint, as the token must have been issued with them:
        ``subject(request)``; ``fingerprint(request)``, or the ``fields_fingerprint`` of the body
        fields it names (``body()``: the request's body, read only then). Each a ``str`` or None;
        what FastAPI's async callables return is awaited by its adapter."""
        subject = self.subject(request) if self.subject else None
        if self.fields is not None:
            return subject, body_fingerprint(body(), content_type, self.fields)
        return subject, self.fingerprint(request) if callable(self.fingerprint) else None

    @staticmethod
    def truncated() -> TokenError:
        return InvalidRequest("The request body ended before its Content-Length.", {"body": ["Incomplete."]})

    # Sync and async alike: each step below is a flow (the engine's: client/_engine.py) that
    # yields the guard's calls; begin/settle/raised drive it blocking, abegin/asettle/araised
    # awaiting what the calls return.

    def begin(
        self, client: Any, token: str, subject: str | None, fingerprint: str | None
    ) -> Guard | Replay | TokenError:
        """A guard on the token (this request holds its lease), a :class:`Replay`, or the refusal."""
        begun = drive(self.beginning(client, token, subject, fingerprint))
        return cast("Guard | Replay | TokenError", begun)  # a TokenClient makes a Guard

    async def abegin(
        self, client: Any, token: str, subject: str | None, fingerprint: str | None
    ) -> AsyncGuard | Replay | TokenError:
        begun = await drive_async(self.beginning(client, token, subject, fingerprint))
        return cast("AsyncGuard | Replay | TokenError", begun)  # an AsyncTokenClient, an AsyncGuard

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
        return self._running(guard) if fresh else Replay(guard.result)

    def _running(self, guard: Any) -> Any:
        self._started[guard] = time.monotonic()
        return guard

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

        The store says how long the holder's lease has left, which is the longest the holder
        can take, not how long it will: a double click got ``Retry-After: 30`` (the lease)
        while the first request finished in milliseconds. The estimate is how long this
        decorator's runs typically take, rounded up to whole seconds (at least 1, the header's
        unit; 1 before any run has settled), never more than the lease has left.
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
        """Whether the view's exception is the response it stands for (rendered by the adapter,
        then settled as a returned one) rather than a failure: one of the framework's HTTP
        exceptions that ``terminal`` does not list (an exception named there is recorded)."""
        return isinstance(exc, self.http_errors) and not guard.is_terminal(exc)

    @staticmethod
    def failed(guard: Guard, exc: BaseException) -> None:
        """The view raised: record a terminal failure, or free the token for a retry."""
        guard.abandon_quietly(exc)

    def raised(self, guard: Guard, exc: BaseException, render: Callable[[], Reply | None]) -> None:
        """The view raised ``exc``, which goes on to the framework: an HTTP exception is settled as
        ``render()`` (the response the framework answers it with; None: it cannot be rendered, the
        token is freed), any other is :meth:`failed`."""
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

        Returns the error to answer instead of the view's response when its outcome could not be
        recorded (:meth:`not_recorded`); None: the response goes out. Raises no store error."""
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
            self._not_stored(exc)
        return None

    def not_recorded(self, exc: OutcomeNotRecorded) -> OutcomeNotRecorded:
        """The answer to the client for an outcome that was not recorded (the guard logged ``exc``,
        with its lease id and the result, for whoever reconciles it): what happened and what a
        retry gets, the record's ``token_ref``, never the lease id or the response."""
        return OutcomeNotRecorded(
            "The request ran, but its outcome could not be recorded: the token store did not answer. "
            "Do not send it again as a new request: with this token a retry is refused "
            "(409 token_in_progress) while the request's lease lasts, and may run it again after that.",
            operation=exc.operation,
            scope=exc.scope,
            token_ref=exc.token_ref,
        )

    def _not_stored(self, exc: TokenError) -> None:
        # LeaseLost: the view outlived its lease, a duplicate may have run it again
        log.error("could not store the response of a %s request: %s", self.scope, exc)

    def result(self, reply: Reply | ValueReply | None) -> dict[str, Any] | None:
        """The token's result for ``reply``, or None: not kept (the token is freed)."""
        if reply is None:
            return None
        if not self.store_status(reply.status or 200):
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
        """A streamed answer (``head``: its status and headers; ``length``: its declared one): what
        to settle at once, or None: :meth:`record` it as it goes out. A status that is not kept
        frees the token, the body untouched; an answer to HEAD sends no body, so it is what it
        answered: settled as omitted (its declared length, else 0)."""
        if not self.store_status(head.status):
            return head
        if method == "HEAD":
            return Reply(head.status, head.headers, omitted=length or 0)
        return None

    def _recorder(self, status: int, headers: Sequence[tuple[str, str]], length: int | None) -> Recorder:
        # held up to what could be kept, never more (the rest is only counted)
        return Recorder(status, list(headers), self.cap_bytes, True, length)

    @staticmethod
    def reply_of(recorder: Recorder, failed: bool) -> Reply | None:
        if failed:
            return None
        stored = recorder.stored()
        assert stored is not None
        return Reply(stored.status, stored.headers, stored.body, stored.omitted)

    def record(self, guard: Guard, chunks: Iterable[Any], head: Reply, length: int | None) -> Recording:
        """``chunks`` (``head``'s body, ``length`` if declared) passed through and recorded;
        settled at its end or when closed, freed if it raises."""
        recorder = self._recorder(head.status, head.headers, length)
        return Recording(chunks, recorder, lambda failed: self.settle(guard, self.reply_of(recorder, failed)))

    def arecord(
        self, guard: AsyncGuard | Guard, chunks: AsyncIterable[Any], head: Reply, length: int | None
    ) -> AsyncRecording:
        recorder = self._recorder(head.status, head.headers, length)

        async def settle(failed: bool) -> OutcomeNotRecorded | None:
            if isinstance(guard, Guard):  # a sync view's async stream (Django serves it on its event loop)
                return self.settle(guard, self.reply_of(recorder, failed))
            return await self.asettle(guard, self.reply_of(recorder, failed))

        return AsyncRecording(chunks, recorder, settle)


def _no_close() -> None:
    pass


def _as_bytes(chunk: Any) -> bytes:
    # a streamed view may yield text: the frameworks encode it as UTF-8 after this
    return chunk.encode() if isinstance(chunk, str) else bytes(chunk)


class Recording:
    """A streamed body on its way out: passed through, recorded, then settled once.

    An outcome that could not be recorded breaks the body off (its error is raised before its
    last bytes go out, so the server aborts the response), unless the body was closed early
    (the client left: nothing is sent any more)."""

    def __init__(
        self, chunks: Iterable[Any], recorder: Recorder, settle: Callable[[bool], OutcomeNotRecorded | None]
    ) -> None:
        self.chunks = chunks
        self.recorder = recorder
        self.settle_with = settle
        self.settled = False

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


class AsyncRecording:
    """:class:`Recording` for an async iterator (FastAPI's ``StreamingResponse``, Django's async streams).

    Settled at its end, when it is closed early (``aclose``: the client left) or
    cancelled, in a task of its own: a cancelled request (anyio cancels every later
    await in its scope) must still store or free its token, never leave it held.
    """

    def __init__(
        self,
        chunks: AsyncIterable[Any],
        recorder: Recorder,
        settle: Callable[[bool], Awaitable[OutcomeNotRecorded | None]],
    ) -> None:
        self.chunks = chunks
        self.recorder = recorder
        self.settle_with = settle
        self.settled = False

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
