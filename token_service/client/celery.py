"""Celery tasks that run at most once per key, however often their message is delivered.

::

    tokens = TokenClient.from_redis("redis://localhost:6379/0")

    @app.task(base=IdempotentTask, token_client=tokens, acks_late=True)
    def send_receipt(order_id: str) -> dict:
        ...

    @app.task(base=IdempotentTask, token_client=tokens, idempotency_key="order_id")
    def charge(order_id: str, amount: int) -> dict:
        ...

By default the key is the task id: a redelivered message (a worker died before
acking it, a visibility timeout ran out) and ``apply_async`` twice with the
same ``task_id`` run the body once. ``idempotency_key`` keys on the arguments
instead (an argument name, several, or a callable given the task's arguments):
two messages for the same order run once. It is :func:`token_service.client.idempotent`
underneath: a lease while the body runs, released when it raises (Celery's own
retries then run it again), terminal failures recorded (``idempotency_terminal``),
and the stored result returned to every duplicate without running the body.

A duplicate that arrives while another worker holds the key is retried
(``self.retry``, not counted against ``max_retries``) when that lease could
next run out or after ``idempotency_poll_seconds``, whichever is sooner, so a worker killed
mid-task (SIGKILL, OOM) is taken over after its lease: set ``acks_late=True``
so the message is redelivered at all, and ``task_reject_on_worker_lost=True``
when a prefork child (not the whole worker) may die.

When the keys' Redis cannot answer, the body does not run (fail closed) and
the message is retried (``self.retry``, within ``max_retries``).

Once the body has run, a Redis that goes away while its result is stored is
waited out for as long as the lease can be held (the guard keeps renewing it
and trying again). Past that the task fails with
:class:`~token_service.errors.OutcomeNotRecorded`, logged at error level with
what reconciling it takes (task id, key, token_ref, lease id, the result that
was not stored); it is never retried, by this class or by ``autoretry_for``: the
body ran. To the key it is a crashed holder: a redelivery or a new message for
the same key after the lease runs the body again (docs/integrations/celery.md).

A task called directly (``send_receipt("o-1")``, no message) and keyed by its
task id has no id to key on: it runs unguarded, as any function call does.
Only this module imports Celery.
"""

from __future__ import annotations

import logging
from typing import Any

from token_service.errors import OutcomeNotRecorded, ServiceUnavailable, TokenInProgress
from token_service.tokens import SCOPE_RE

from ._client import TokenClient
from ._extras import install, missing
from .guard import Guard, Terminal
from .keyed import DEFAULT_KEY_TTL_SECONDS, KeySpec, _key_reader, keyed_guard

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

    def _key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.idempotency_key is None:
            return self.request.id
        return _key_reader(self.run, self.idempotency_key, "key")(args, kwargs)

    def idempotency_guard(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Guard | None:
        """The guard of this call, or None for a direct call keyed by a task id it does not have."""
        if self.token_client is None:
            raise TypeError(f"task {self.name!r}: set token_client (a TokenClient.from_redis(...))")
        key = self._key(args, kwargs)
        if key is None and self.idempotency_key is None:
            return None
        guard: Guard = keyed_guard(
            self.token_client,
            self._scope(),
            key,
            ttl_seconds=self.idempotency_ttl_seconds,
            lease_seconds=self.idempotency_lease_seconds,
            terminal=self.idempotency_terminal,
            wait_seconds=self.idempotency_wait_seconds,
        )
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
            # Another worker holds the key (or held it and died): come back when its lease
            # could next run out. Never counted against max_retries: the holder finishes or
            # stops renewing, so this ends.
            # A duration from the store's answer. Celery turns it into an ETA on this worker's
            # clock and the next worker compares that with its own: a skewed worker only
            # retries early or late, and the retry's begin is again decided by Redis's clock.
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
