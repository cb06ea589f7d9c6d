"""The faults a user's code must handle, on the kit's in-memory store (``token_faults``).

- :meth:`StoreFaults.store_down`: every call meets a store that cannot answer, as
  a Redis that refuses connections: the SDK raises ``ServiceUnavailable`` (after
  its retries, which the kit's clients make without waiting), the integrations
  answer 503 ``store_unavailable``.
- :meth:`StoreFaults.in_flight` / :meth:`StoreFaults.in_flight_key`: another
  process holds the operation right now (a token's, or a keyed operation's such
  as ``@idempotent`` or a Celery task): a duplicate gets ``TokenInProgress``
  (409 ``token_in_progress``). The holder is an :class:`InFlight`: it can
  finish (duplicates then get its result), fail, or :meth:`InFlight.crash`, after
  which its lease lapses and a duplicate takes the operation over.

Each is built on the SDK's public API (a guard's ``start`` / ``succeed`` /
``abandon``) and on fakeredis's own "server disconnected" switch.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, Protocol

from token_service.client import Guard, TokenClient, keyed_guard

from ._clock import StoreClock

__all__ = ["InFlight", "StoreFaults"]


class _Store(Protocol):
    """What the faults use of the kit's store (``_store.InMemoryStore``), named here so that
    this module does not import that one, which imports this one."""

    clock: StoreClock
    _server: Any

    def client(self, **options: Any) -> TokenClient: ...


# A lease a test's holder takes when it names none: the API's default
DEFAULT_LEASE_SECONDS = 30
# past the end of a lease, as Redis's clock counts it (milliseconds): a crashed holder's lease is over
_PAST_THE_LEASE_SECONDS = 0.001


class InFlight:
    """An operation another holder is running now, on the store of the test (no renewal: it is
    elsewhere). Duplicates meanwhile get ``TokenInProgress``."""

    def __init__(self, store: _Store, guard: Guard, lease_seconds: int) -> None:
        self._store = store
        self._guard = guard
        self.lease_seconds = lease_seconds
        self.crashed = False

    def __repr__(self) -> str:
        scope, lease = self._guard.scope, self.lease_seconds
        return f"<InFlight scope={scope!r} lease_seconds={lease} crashed={self.crashed}>"

    @property
    def lease_id(self) -> str:
        """The holder's lease (its fencing id)."""
        return self._guard.lease_id

    def crash(self) -> None:
        """The holder dies now, without a word: the store's clock moves to the end of its lease
        (``lease_seconds`` on: everything else ages as much), so the next begin takes over. The
        dead holder can no longer record anything (:meth:`finish` raises ``LeaseLost``)."""
        if self.crashed:
            return  # it died once: its lease ended then
        self.crashed = True
        self._store.clock.advance(self.lease_seconds + _PAST_THE_LEASE_SECONDS)

    def finish(self, result: Any = None) -> Any:
        """The holder completes with ``result``: duplicates from now on get it (a replay).
        Raises ``LeaseLost`` when its lease ran out first (after :meth:`crash`, or a
        ``token_clock.advance`` past it) and someone took over."""
        return self._guard.succeed(result)

    def fail(self, *, retryable: bool = True, error: Any = None) -> None:
        """The holder gives up: released for a retry (``retryable``), else a terminal failure with
        ``error`` (duplicates get ``TokenFailed``)."""
        self._guard.abandon(retryable=retryable, error=error)


class StoreFaults:
    """What can go wrong around the store, switched on by a test (``token_faults``)."""

    def __init__(self, store: _Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._down = 0

    @property
    def down(self) -> bool:
        """Whether the store answers nothing right now."""
        return self._down > 0

    @contextlib.contextmanager
    def store_down(self) -> Iterator[None]:
        """Inside the block every call to the store fails as with a Redis that refuses connections:
        ``ServiceUnavailable`` from the SDK, 503 from the integrations. Blocks may nest; the store
        answers again when the outermost one ends."""
        with self._lock:
            self._down += 1
            self._store._server.connected = False
        try:
            yield
        finally:
            with self._lock:
                self._down -= 1
                if self._down == 0:
                    self._store._server.connected = True

    def in_flight(
        self,
        token: str,
        scope: str,
        *,
        subject: str | None = None,
        fingerprint: str | None = None,
        lease_seconds: int = DEFAULT_LEASE_SECONDS,
    ) -> InFlight:
        """Another request holds ``token`` now (it ``begin``-s it with the same bindings): until it
        finishes, fails or crashes, a duplicate gets ``TokenInProgress`` (409)."""
        guard = self._store.client().guard(
            token, scope, subject=subject, fingerprint=fingerprint, lease_seconds=lease_seconds, renew=False
        )
        return self._started(guard, lease_seconds)

    def in_flight_key(
        self, scope: str, key: Any, *, fingerprint: Any = None, lease_seconds: int = DEFAULT_LEASE_SECONDS
    ) -> InFlight:
        """Another worker runs the keyed operation ``key`` of ``scope`` now (``@idempotent``,
        ``keyed_guard``, an ``IdempotentTask``: the scope and key your code uses, and its
        ``fingerprint`` if it gives one)."""
        client = self._store.client()
        guard = keyed_guard(
            client, scope, key, fingerprint=fingerprint, lease_seconds=lease_seconds, renew=False
        )
        return self._started(guard, lease_seconds)

    def _started(self, guard: Guard, lease_seconds: int) -> InFlight:
        if not guard.start():
            raise RuntimeError("that operation already finished (its result is stored): nothing can hold it")
        return InFlight(self._store, guard, lease_seconds)

    def _reset(self) -> None:
        with self._lock:
            self._down = 0
            self._store._server.connected = True
