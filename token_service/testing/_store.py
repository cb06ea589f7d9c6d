"""The in-memory store of the testing kit: fakeredis with Lua, on a clock the test moves.

The SDK runs on it through its public seam, ``TokenClient.from_redis`` given a
Redis client: the very scripts of ``lua/`` run, on fakeredis's Lua (lupa), so
a test's answers are production's. Two hooks make fakeredis read
:class:`~token_service.testing.StoreClock` instead of this host's clock, on
this store's server only (any other fakeredis server in the process keeps the
real time):

- key expiry: fakeredis compares each key's expiry with its database's
  ``time``, which it sets from ``time.time()`` before every command; the
  databases here add the clock's offset to what it sets;
- ``TIME`` (what the scripts take "now" from, for leases): the command answers
  the clock of the server it runs on, where that server is one of the kit's.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import weakref
from collections import defaultdict
from typing import Any

from token_service.client._extras import install, missing

try:
    import fakeredis
    import lupa  # noqa: F401  # the scripts need fakeredis's Lua: say so now, not at the first call
    from fakeredis.commands_mixins.server_mixin import ServerCommandsMixin
except ModuleNotFoundError as exc:  # tests/testing/test_kit_misuse.py
    missing(
        exc,
        "token_service.testing (it runs the scripts on fakeredis with Lua)",
        ("fakeredis", "lupa"),
        install("client"),
    )

from token_service.client import AsyncTokenClient, RetryPolicy, TokenClient

from ._clock import StoreClock
from ._faults import StoreFaults

__all__ = ["InMemoryStore", "StoreClosed"]

# The SDK's retries as in production (every attempt made), without the waits between them:
# a store that is down answers at once, and a test of an outage sleeps for nothing.
NO_WAIT_RETRY = RetryPolicy(backoff_seconds=0.0)

# this process's kit servers and their clocks (a server that is not here keeps the real time)
_CLOCKS: weakref.WeakKeyDictionary[Any, StoreClock] = weakref.WeakKeyDictionary()
_install_lock = threading.Lock()


class StoreClosed(RuntimeError):
    """A client of the kit used after the test that made it ended (its store was reset since)."""


def _shifted_database_class(base: type[Any], clock: StoreClock) -> type[Any]:
    """fakeredis's Database, its ``time`` this store's clock: set to this host's time, read ahead."""

    class ShiftedDatabase(base):  # type: ignore[misc]
        @property
        def time(self) -> float:
            return float(self._host_time) + clock.offset_seconds

        @time.setter
        def time(self, value: float) -> None:
            self._host_time = value

    return ShiftedDatabase


def _patch_time_command() -> None:
    """``TIME`` on a kit server answers that server's clock; on any other, as before (once per process)."""
    with _install_lock:
        original = ServerCommandsMixin.time
        if getattr(original, "_token_service_kit", False):
            return

        @functools.wraps(original)  # keeps fakeredis's command signature on the method
        def time_command(self: Any) -> list[bytes]:
            clock = _CLOCKS.get(self._server)
            if clock is None:
                return original(self)  # type: ignore[no-any-return]
            now_us = round(clock.now() * 1_000_000)
            return [str(now_us // 1_000_000).encode(), str(now_us % 1_000_000).encode()]

        time_command._token_service_kit = True  # type: ignore[attr-defined]
        ServerCommandsMixin.time = time_command  # type: ignore[method-assign]


def _new_server(clock_holder: list[StoreClock]) -> Any:
    server = fakeredis.FakeServer()
    clock = StoreClock(server.lock)
    base = type(server.dbs[0])
    shifted = _shifted_database_class(base, clock)
    # before any client exists: each connection keeps the database objects it was given
    server.dbs = defaultdict(lambda: shifted(server.lock))
    _CLOCKS[server] = clock
    clock_holder.append(clock)
    return server


class InMemoryStore:
    """A Redis of the test's own, in this process: the fixtures' store (``token_store``).

    ``client()`` and ``async_client()`` are the SDK's clients on it (``from_redis``),
    ``redis()`` and ``async_redis()`` plain Redis clients for what takes one (the
    Idempotency-Key middlewares' ``redis``, Django's ``TOKEN_SERVICE["REDIS_URL"]``,
    ``from_redis`` in your own code). ``clock`` moves its time, ``faults`` breaks it.
    :meth:`reset` empties it between tests: the same store serves every test of a
    process, so a client your code made once (at import, or cached) still reaches it.
    """

    def __init__(self) -> None:
        _patch_time_command()
        clocks: list[StoreClock] = []
        self._server = _new_server(clocks)
        self.clock: StoreClock = clocks[0]
        self.faults = StoreFaults(self)
        self._generation = 0
        self._test_name = ""

    # -- Redis clients ------------------------------------------------------------------------

    def redis(self) -> Any:
        """A (sync) redis-py client of this store (a ``fakeredis.FakeRedis``)."""
        return fakeredis.FakeRedis(server=self._server)

    def async_redis(self) -> Any:
        """An asyncio redis-py client of this store, for use on one event loop."""
        return fakeredis.FakeAsyncRedis(server=self._server)

    # -- the SDK's clients --------------------------------------------------------------------

    def client(self, **options: Any) -> TokenClient:
        """A :class:`TokenClient` on this store (``TokenClient.from_redis``; ``options`` are its)."""
        options.setdefault("retry", NO_WAIT_RETRY)
        client = _KitClient.from_redis(self.redis(), **options)
        assert isinstance(client, _KitClient)  # from_redis builds its own class
        client._kit_bind(self)
        return client

    def async_client(self, **options: Any) -> AsyncTokenClient:
        """An :class:`AsyncTokenClient` on this store, for the event loop that first uses it."""
        options.setdefault("retry", NO_WAIT_RETRY)
        client = _KitAsyncClient.from_redis(self.async_redis(), **options)
        assert isinstance(client, _KitAsyncClient)
        client._kit_bind(self)
        return client

    # -- between tests -------------------------------------------------------------------------

    def reset(self, test_name: str = "") -> None:
        """Empty: no records, the clock back to this host's time, no faults; clients made before
        refuse to run (:class:`StoreClosed`) so that no test reaches another's tokens."""
        self.faults._reset()
        self.clock._reset()
        self.redis().flushall()
        self._generation += 1
        self._test_name = test_name

    def _check(self, generation: int, made_in: str) -> None:
        if generation != self._generation:
            raise StoreClosed(
                f"this client of the in-memory store was made in the test {made_in or '(unnamed)'!r}, "
                "which has ended (its tokens are gone): make clients in the test that uses them "
                "(the token_client fixture, or token_store.client())"
            )


class _KitClient(TokenClient):
    """A TokenClient that refuses to run once its test has ended (nothing else differs)."""

    _kit_store: InMemoryStore | None = None
    _kit_generation = 0
    _kit_test = ""

    def _kit_bind(self, store: InMemoryStore) -> None:
        self._kit_store, self._kit_generation, self._kit_test = store, store._generation, store._test_name

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        if self._kit_store is not None:
            self._kit_store._check(self._kit_generation, self._kit_test)
        return super()._call(*args, **kwargs)


class _KitAsyncClient(AsyncTokenClient):
    """An AsyncTokenClient bound to the first event loop that uses it (its connections are that
    loop's), refusing another loop with a clear error, and refusing to run after its test."""

    _kit_store: InMemoryStore | None = None
    _kit_generation = 0
    _kit_test = ""
    _kit_loop: weakref.ref[asyncio.AbstractEventLoop] | None = None

    def _kit_bind(self, store: InMemoryStore) -> None:
        self._kit_store, self._kit_generation, self._kit_test = store, store._generation, store._test_name

    async def _call(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        if self._kit_store is not None:
            self._kit_store._check(self._kit_generation, self._kit_test)
        loop = asyncio.get_running_loop()
        if self._kit_loop is None:
            self._kit_loop = weakref.ref(loop)
        elif self._kit_loop() is not loop:
            raise RuntimeError(
                "this AsyncTokenClient of the in-memory store serves the event loop that first used "
                "it, and this call runs on another (its connections belong to that loop): make one "
                "client per loop with token_store.async_client()"
            )
        return await super()._call(*args, **kwargs)
