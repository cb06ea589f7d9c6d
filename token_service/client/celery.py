"""Celery tasks that run at most once per key, however often their message is delivered.

``@app.task(base=IdempotentTask, token_client=tokens)`` keys on the task id (a redelivered
message, ``apply_async`` twice with one ``task_id``); ``idempotency_key`` on the arguments (a
name, several, or a callable). It is :func:`token_service.client.idempotent` underneath, and
docs/integrations/celery.md says what each duplicate sees. What is Celery's own here: a duplicate
that finds the key held is retried (``self.retry``, not counted against ``max_retries``) when that
lease could next run out, so a worker killed mid-task is taken over (with ``acks_late=True``); a
Redis that cannot answer before the body runs is a retry within ``max_retries`` (fail closed); an
outcome not recorded after the body ran (:class:`~token_service.errors.OutcomeNotRecorded`) fails
the task, never retried: the body ran. A task called directly and keyed by its task id has no id
to key on: it runs unguarded, as any function call does. Only this module imports Celery.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from token_service.errors import OutcomeNotRecorded, ServiceUnavailable, TokenInProgress
from token_service.tokens import SCOPE_RE

from ._client import KeyedCalls, TokenClient, keyed_calls
from ._extras import install, missing
from .guard import Guard, Terminal
from .keyed import DEFAULT_KEY_TTL_SECONDS, KeySpec, _guard_for, _key_reader

try:
    from celery import Task
except ModuleNotFoundError as exc:
    missing(exc, __name__, ("celery",), install("celery"))

__all__ = ["IdempotentTask"]

log = logging.getLogger(__name__)


class IdempotentTask(Task):  # type: ignore[misc]  # Celery ships no type hints
    """A task base class: the body runs at most once per key (the task id unless ``idempotency_key``)."""

    abstract = True
    #: The :class:`TokenClient` (direct transport) whose Redis holds the keys.
    token_client: TokenClient | None = None
    #: None: the task id. Else an argument name, several names, or a callable given the arguments.
    idempotency_key: KeySpec | None = None
    #: The scope keys live in; default the task's name (it must fit a scope: 1-64 of A-Za-z0-9._:-).
    idempotency_scope: str | None = None
    idempotency_lease_seconds: int | None = None
    idempotency_wait_seconds: float = 0.0
    idempotency_terminal: Terminal = ()
    idempotency_ttl_seconds: int = DEFAULT_KEY_TTL_SECONDS
    #: A duplicate that finds the key held is retried after the holder's lease could run
    #: out, or after this many seconds if sooner (the holder may finish early).
    idempotency_poll_seconds: float = 5.0

    def _scope(self) -> str:
        scope = self.idempotency_scope or self.name
        if not isinstance(scope, str) or not SCOPE_RE.match(scope):
            raise TypeError(
                f"task {self.name!r}: its name is not a scope (1-64 chars of A-Za-z0-9._:-); "
                "set idempotency_scope"
            )
        return scope

    # what each call's guard is made of, with the options it was made from: made again when one
    # of them is set anew (a test's monkeypatch of token_client), else kept for the task's calls
    _guarding: tuple[tuple[Any, ...], KeyedCalls, str, dict[str, Any], Callable[..., Any] | None] | None
    _guarding = None

    def idempotency_guard(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Guard | None:
        """The guard of this call, or None for a direct call keyed by a task id it does not have."""
        if self.token_client is None:
            raise TypeError(f"task {self.name!r}: set token_client (a TokenClient.from_redis(...))")
        if self.idempotency_key is None and self.request.id is None:
            return None
        made_of = (
            self.token_client,
            self.idempotency_key,
            self.idempotency_scope,
            self.idempotency_lease_seconds,
            self.idempotency_terminal,
            self.idempotency_wait_seconds,
            self.idempotency_ttl_seconds,
        )
        guarding = self._guarding
        if guarding is None or guarding[0] != made_of:
            options = {
                "lease_seconds": self.idempotency_lease_seconds,
                "terminal": self.idempotency_terminal,
                "wait_seconds": self.idempotency_wait_seconds,
            }
            spec = self.idempotency_key
            if inspect.ismethod(spec) and spec.__self__ is self:
                spec = spec.__func__  # a function set as a task attribute: given the arguments alone
            read_key = None if spec is None else _key_reader(self.run, spec, "key")
            keyed = keyed_calls(self.token_client, self.idempotency_ttl_seconds)
            guarding = self._guarding = (made_of, keyed, self._scope(), options, read_key)
        _, keyed, scope, options, read_key = guarding
        key = self.request.id if read_key is None else read_key(args, kwargs)
        guard: Guard = _guard_for(keyed, scope, key, None, options)
        return guard

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        guard = self.idempotency_guard(args, kwargs)
        if guard is None:
            return super().__call__(*args, **kwargs)
        try:
            result = guard.run(super().__call__, *args, **kwargs)
        except TokenInProgress as busy:
            if self.request.called_directly:
                raise
            # Another worker holds the key (or held it and died): back when its lease could next
            # run out, never counted against max_retries (the holder finishes or stops renewing).
            # A duration from the store's answer: a worker whose clock is off only retries early
            # or late, and the retry's begin is again decided by Redis's clock.
            countdown = min(busy.retry_after_seconds, self.idempotency_poll_seconds)
            log.info(
                "task %s[%s]: key in progress elsewhere; retry in %s s", self.name, self.request.id, countdown
            )
            try:
                unbounded = self.request.retries + 1
                raise self.retry(exc=busy, countdown=countdown, max_retries=unbounded) from busy
            finally:
                # retry() leaves the override on the (shared) task object for autoretry_for to read
                self.__dict__.pop("override_max_retries", None)
        except OutcomeNotRecorded as not_recorded:
            # The body ran and its outcome is not stored: retrying would run it again as if
            # nothing had happened. The task fails, with what a person needs to reconcile it.
            log.error(
                "task %s[%s]: the body ran but its outcome (%s) could not be recorded: not retried; "
                "reconcile key %r (token_ref %s, lease %s); the result not stored: %r",
                self.name,
                self.request.id,
                not_recorded.operation,
                not_recorded.key,
                not_recorded.token_ref,
                not_recorded.lease_id,
                not_recorded.result if not_recorded.operation == "complete" else not_recorded.error,
            )
            raise
        except ServiceUnavailable as down:
            if self.request.called_directly:
                raise
            # The keys' Redis cannot answer: the body must not run unguarded, and the message
            # must not be lost either. Retried like any failure, within max_retries.
            log.warning("task %s[%s]: the keys' store is unavailable; retrying", self.name, self.request.id)
            countdown = min(down.retry_after_seconds, self.idempotency_poll_seconds)
            raise self.retry(exc=down, countdown=countdown) from down
        if guard.replayed:
            log.info(
                "task %s[%s]: already ran for this key; its stored result is returned",
                self.name,
                self.request.id,
            )
        return result
