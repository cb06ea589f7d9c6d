"""Build the Redis client the store runs on, from the configuration.

``TOKEN_SERVICE_REDIS_URL`` selects the topology:

- empty: the embedded in-memory store (fakeredis with Lua), for trying the
  service out in one process, never for production — nothing survives a
  restart and workers would not share it;
- ``redis://``, ``rediss://``, ``unix://``: one server;
- ``redis+sentinel://[user:pass@]host:port,host:port/<master-name>[/<db>]``: the
  master that the sentinels name. Every command goes to the master (never a
  replica: a consume must see the latest write), and after a failover the next
  connection asks the sentinels again;
- ``redis+cluster://[user:pass@]host:port,host:port``: a Redis Cluster. Every
  script touches one key, so each runs on the node owning that key's slot;
  redis-py follows MOVED and ASK redirections and re-reads the slot map.

The ``rediss+`` variants use TLS to the data nodes.

Every connection of a sync client (standalone, Sentinel, Cluster) keeps to the caller's
deadline (:mod:`token_service.deadline`): a connect, a send, a read and
redis-py's back-off between its retries wait no longer than the deadline has
left, and none starts once it is spent. Without a deadline each waits its
configured timeout, as redis-py's own would.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis import exceptions as redis_errors
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import AbstractBackoff, ExponentialBackoff
from redis.retry import Retry

from token_service import deadline, defaults
from token_service.config import RedisTarget, Settings, parse_redis_url

__all__ = [
    "BACKOFF_CAP_SECONDS",
    "EMBEDDED_WARNING",
    "MAX_CONNECTIONS",
    "DeadlineConnection",
    "DeadlineSSLConnection",
    "DeadlineSentinelConnection",
    "DeadlineSentinelSSLConnection",
    "DeadlineSpent",
    "DeadlineUnixConnection",
    "async_client_for",
    "client_for",
    "embedded_client",
    "redis_client",
    "request_budget_seconds",
]

log = logging.getLogger(__name__)

EMBEDDED_WARNING = (
    "TOKEN_SERVICE_REDIS_URL is not set: running on the EMBEDDED IN-MEMORY STORE. "
    "Tokens live in this one process and are lost on restart. Do not use this in production."
)
# One quick retry absorbs a reset connection or a reconnect to a new master.
# It is safe for every script: consume/begin carry a request id (a replayed win
# stays a win), issue uses SET NX with a fresh token, the rest are idempotent.
_RETRIES = 1
# A cluster also retries after refreshing its slot map (a failed-over primary).
_CLUSTER_RETRIES = 2
# Connections one client may open (per node): TOKEN_SERVICE_REDIS_MAX_CONNECTIONS for the
# service, from_redis(max_connections=) for the SDK. Under gevent workers every request is a
# greenlet and up to worker_connections (1000) of them may wait on Redis at once: on one server
# they wait for a pooled connection within their deadline (BoundedPool), never open more.
MAX_CONNECTIONS = defaults.REDIS_MAX_CONNECTIONS


def request_budget_seconds(settings: Settings) -> float:
    """The longest the service spends on Redis for one request: its worst case, by construction.

    One deadline per request, started at its first Redis step (the server's
    ``FinishBody``), that every step keeps to: the wait for a pooled
    connection, connects and handshakes, each send and read, and redis-py's
    retries (one, two on Cluster) with their back-off. It is one
    ``TOKEN_SERVICE_REDIS_TIMEOUT_SECONDS`` for the first attempt and one for
    each retry: with the default 2 s, a request answers within 4 s of asking
    Redis, 503 if Redis did not answer by then. ``token-service check`` prints
    it; a proxy's read timeout and the probes' timeouts are set from it
    (docs/configuration.md).
    """
    cluster = bool(settings.redis_url) and settings.redis_target.kind == "cluster"
    retries = _CLUSTER_RETRIES if cluster else _RETRIES
    return settings.redis_timeout_seconds * (1 + retries)


def redis_client(settings: Settings) -> Any:
    if settings.redis_client is not None:
        return settings.redis_client
    if settings.embedded:
        return embedded_client()
    return client_for(
        settings.redis_target,
        settings.redis_timeout_seconds,
        max_connections=settings.redis_max_connections,
        idle_seconds=settings.redis_idle_seconds,
    )


# The slowest back-off redis-py waits between its retries (a deadline shortens it).
BACKOFF_CAP_SECONDS = 0.2


class _BackoffWithinDeadline(AbstractBackoff):
    """redis-py's exponential back-off, never past the caller's deadline: a retry due after
    it is tried at once, and fails at once (:class:`_WithinDeadline`), instead of sleeping."""

    def __init__(self) -> None:
        self._backoff = ExponentialBackoff(cap=BACKOFF_CAP_SECONDS, base=0.02)

    def reset(self) -> None:
        self._backoff.reset()  # type: ignore[no-untyped-call]

    def compute(self, failures: int) -> float:
        delay = float(self._backoff.compute(failures))
        remaining = deadline.remaining_seconds()
        return delay if remaining is None else max(0.0, min(delay, remaining))


def _backoff() -> AbstractBackoff:
    return _BackoffWithinDeadline()


class DeadlineSpent(redis_errors.TimeoutError):
    """The caller's deadline passed before this step of a Redis call could start."""


# A wait clamped to the deadline only when that shortens it by more than this: an unclamped
# wait then ends this much past the deadline at worst, and the socket keeps its configured
# timeout (no settimeout system call) on a call that started with its whole budget.
_CLAMP_SLACK_SECONDS = 0.01


class _WithinDeadline:
    """Mixed into redis-py's connection classes: each connect, send and read keeps to the deadline.

    redis-py sets a socket's timeout once, when it connects, and waits that
    long for every read whatever came before it; a call that reconnects and
    retries could wait several timeouts. Here the socket's timeout is lowered
    to what the deadline has left before each send and read (and put back when
    there is no deadline or it is further away), the connect's timeout too;
    a step that would start after the deadline raises :class:`DeadlineSpent`
    instead (a read that would have followed a send drops the connection, so
    the next command never reads this one's reply).
    """

    _clamped = False
    _sock: Any
    socket_timeout: float | None
    socket_connect_timeout: float | None

    def _connect(self) -> Any:
        remaining = deadline.remaining_seconds()
        configured = self.socket_connect_timeout
        if remaining is None or (configured is not None and remaining >= configured):
            sock = super()._connect()  # type: ignore[misc]
        elif remaining <= 0:
            raise DeadlineSpent("the call's deadline passed before connecting to Redis")
        else:
            self.socket_connect_timeout = remaining
            try:
                sock = super()._connect()  # type: ignore[misc]
            finally:
                self.socket_connect_timeout = configured
        self._clamped = False  # a new socket: its timeout is the configured one
        return sock

    def _keep_to_deadline(self) -> None:
        sock = self._sock
        if sock is None:
            return  # connect() applies the deadline to the connect, and the reads after it
        remaining = deadline.remaining_seconds()
        configured = self.socket_timeout
        if remaining is not None:
            if remaining <= 0:
                raise DeadlineSpent("the call's deadline passed before Redis answered")
            if configured is None or remaining < configured - _CLAMP_SLACK_SECONDS:
                sock.settimeout(remaining)
                self._clamped = True
                return
        if self._clamped:
            sock.settimeout(configured)
            self._clamped = False

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        self._keep_to_deadline()
        super().send_packed_command(command, check_health)  # type: ignore[misc]

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            self._keep_to_deadline()
        except DeadlineSpent:
            self.disconnect()  # type: ignore[attr-defined]  # its reply will not be read
            raise
        return super().read_response(*args, **kwargs)  # type: ignore[misc]


class DeadlineConnection(_WithinDeadline, redis.Connection):
    """A TCP connection that keeps to the caller's deadline."""


class DeadlineSSLConnection(_WithinDeadline, redis.SSLConnection):
    """A TLS connection that keeps to the caller's deadline."""


class DeadlineUnixConnection(_WithinDeadline, redis.UnixDomainSocketConnection):
    """A Unix-socket connection that keeps to the caller's deadline."""


class DeadlineSentinelConnection(_WithinDeadline, redis.sentinel.SentinelManagedConnection):
    """A connection to the master the sentinels name, keeping to the caller's deadline."""


class DeadlineSentinelSSLConnection(_WithinDeadline, redis.sentinel.SentinelManagedSSLConnection):
    """The same over TLS."""


_WITHIN_DEADLINE: dict[type[Any], type[Any]] = {
    redis.Connection: DeadlineConnection,
    redis.SSLConnection: DeadlineSSLConnection,
    redis.UnixDomainSocketConnection: DeadlineUnixConnection,
}


# When a pooled connection was last handed back (time.monotonic()), for the idle reaper
_RELEASED_AT = "_token_service_released_at"


def _is_full(error: Exception) -> bool:
    # MaxConnectionsError on redis-py >= 6, a plain ConnectionError before
    return isinstance(error, redis_errors.ConnectionError) and str(error) == "Too many connections"


class BoundedPool(redis.ConnectionPool):
    """At most ``max_connections`` connections, a wait for one within the caller's deadline,
    and the connections idle for ``idle_seconds`` closed.

    redis-py's ``ConnectionPool`` opens a connection for every caller that
    finds none free, up to its ``max_connections`` (2,048 here before), and
    keeps all of them open for good: 1,000 requests during an 8 s stall of
    Redis left 513 connections open afterwards. Here a caller beyond the bound
    waits for one to be handed back, no longer than its deadline (or
    ``wait_seconds`` without one), then gets ``ConnectionError`` (503
    ``store_unavailable``). Not redis-py's ``BlockingConnectionPool``: its
    queue of free slots lost slots for good when greenlets were interrupted
    (``gevent.Timeout``, a kill) around the hand-over, and a pool that loses
    them all answers nothing again (tests/edge/test_gevent_store.py); here the
    count is the pool's own, under its lock, and a waiter holds nothing.

    redis-py closes no idle connection itself (``health_check_interval``
    only PINGs one before its next use): a daemon thread of this process (a
    greenlet under gevent) wakes every ``idle_seconds / 2`` and closes each
    pooled connection unused for ``idle_seconds``; the next caller to take it
    reconnects. Connections parked outside the pool (a store's, see
    :meth:`add_idle_hook`) are handed back first, so an idle one is closed too.
    """

    def __init__(
        self, *, idle_seconds: float | None = None, wait_seconds: float | None = None, **options: Any
    ) -> None:
        # the class the URL's scheme chose (TCP, TLS, Unix socket), keeping to the deadline
        chosen = options.get("connection_class", redis.Connection)
        options["connection_class"] = _WITHIN_DEADLINE.get(chosen, chosen)
        self.idle_seconds = idle_seconds
        self.wait_seconds = wait_seconds
        self._reaper_pid = 0
        self._idle_hooks: list[weakref.WeakMethod[Callable[[], None]]] = []
        self._freed = threading.Condition()
        self._waiting = 0  # callers waiting for a connection (under _freed)
        self._released = 0  # hand-backs so far (under _freed): a waiter misses none
        super().__init__(**options)

    def reset(self) -> None:
        super().reset()
        self._freed = threading.Condition()  # a fork's child: not the parent's (maybe held) lock
        self._waiting = self._released = 0

    def add_idle_hook(self, hook: Callable[[], None]) -> None:
        """``hook`` (a bound method, held weakly) hands back what its owner keeps outside the
        pool; called before each round of closing idle connections."""
        self._idle_hooks.append(weakref.WeakMethod(hook))

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        waited_from = time.monotonic()
        queued = False
        try:
            while True:
                released = self._released
                # a newcomer waits behind the callers already waiting, or they could starve
                if queued or not self._waiting:
                    try:
                        return super().get_connection(*args, **kwargs)
                    except redis_errors.ConnectionError as error:
                        if not _is_full(error):
                            raise
                left = self._wait_left(waited_from)
                if left <= 0:
                    raise redis_errors.ConnectionError(
                        f"all {self.max_connections} connections to Redis are in use"
                    )
                with self._freed:
                    if not queued:
                        queued = True
                        self._waiting += 1
                    if self._released == released:  # none handed back since it looked: wait, in turn
                        self._freed.wait(left)
        except BaseException:
            if queued:  # woken, and gone without taking it (interrupted, out of time): next one
                with self._freed:
                    self._freed.notify()
            raise
        finally:
            if queued:
                with self._freed:
                    self._waiting -= 1

    def _wait_left(self, waited_from: float) -> float:
        waited = time.monotonic() - waited_from
        left = math.inf if self.wait_seconds is None else self.wait_seconds - waited
        remaining = deadline.remaining_seconds()
        return left if remaining is None else min(left, remaining)

    def make_connection(self) -> Any:
        if self.idle_seconds is not None and self._reaper_pid != os.getpid():
            self._reaper_pid = os.getpid()  # one reaper per process: after a fork, the child's
            threading.Thread(
                target=_close_idle_while_alive,
                args=(weakref.ref(self), self.idle_seconds / 2),
                name="token-service-redis-idle",
                daemon=True,
            ).start()
        return super().make_connection()

    def release(self, connection: Any) -> None:
        setattr(connection, _RELEASED_AT, time.monotonic())
        super().release(connection)
        with self._freed:
            self._released += 1
            self._freed.notify()

    def idle_connections(self) -> list[Any]:
        """The connections in the pool, waiting to be taken (open or closed)."""
        with self._lock:
            return list(self._available_connections)

    def in_use_count(self) -> int:
        """Connections taken out of the pool and not handed back (a store's parked ones too)."""
        with self._lock:
            return len(self._in_use_connections)

    def close_idle(self) -> int:
        """Close the pooled connections unused for ``idle_seconds``; how many were closed."""
        if self.idle_seconds is None:
            return 0
        for ref in list(self._idle_hooks):
            hook = ref()
            if hook is None:
                self._idle_hooks.remove(ref)
            else:
                hook()
        cutoff = time.monotonic() - self.idle_seconds
        closed = 0
        with self._lock:  # none of them can be taken while they are being closed
            for connection in self._available_connections:
                if connection._sock is not None and getattr(connection, _RELEASED_AT, math.inf) <= cutoff:
                    connection.disconnect()
                    closed += 1
        return closed


def _close_idle_while_alive(pool_ref: weakref.ref[BoundedPool], interval_seconds: float) -> None:
    pid = os.getpid()
    while True:
        time.sleep(interval_seconds)
        pool = pool_ref()
        if pool is None or pool._reaper_pid != pid:
            return  # the pool is gone (its client closed and dropped), or this is a forked copy
        try:
            pool.close_idle()
        except Exception:  # a reaper that died would leave every later idle connection open
            log.exception("closing idle Redis connections failed")
        del pool


def _standalone_pool(
    url: str, timeout_seconds: float, max_connections: int, idle_seconds: float | None
) -> BoundedPool:
    return BoundedPool.from_url(
        url,
        socket_timeout=timeout_seconds,
        socket_connect_timeout=timeout_seconds,
        max_connections=max_connections,
        wait_seconds=timeout_seconds,  # for a free connection, when no deadline is shorter
        retry=Retry(_backoff(), retries=_RETRIES),
        health_check_interval=30,
        idle_seconds=idle_seconds,
    )


def _node_options(target: RedisTarget, timeout_seconds: float, max_connections: int) -> dict[str, Any]:
    options: dict[str, Any] = {
        "socket_timeout": timeout_seconds,
        "socket_connect_timeout": timeout_seconds,
        "max_connections": max_connections,
        "username": target.username,
        "password": target.password,
    }
    if target.ssl:
        options["ssl"] = True
    return options


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host  # an IPv6 address, bracketed as a URL writes it


def client_for(
    target: RedisTarget | str,
    timeout_seconds: float = 2.0,
    *,
    max_connections: int = MAX_CONNECTIONS,
    idle_seconds: float | None = defaults.REDIS_IDLE_SECONDS,
) -> Any:
    """A sync redis-py client for a URL or parsed target (standalone, Sentinel or Cluster),
    with at most ``max_connections`` connections (per node); on one server, a
    :class:`BoundedPool` that also closes those idle for ``idle_seconds``."""
    if isinstance(target, str):
        target = parse_redis_url(target)
    if target.kind == "sentinel":
        sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(target.nodes),
            sentinel_kwargs={"socket_timeout": timeout_seconds, "socket_connect_timeout": timeout_seconds},
        )
        options = _node_options(target, timeout_seconds, max_connections)
        tls = options.pop("ssl", False)
        return sentinel.master_for(  # type: ignore[no-untyped-call]
            target.service_name,
            db=target.db,
            retry=Retry(_backoff(), retries=_RETRIES),
            connection_class=DeadlineSentinelSSLConnection if tls else DeadlineSentinelConnection,
            **options,
        )
    if target.kind == "cluster":
        options = _node_options(target, timeout_seconds, max_connections)
        tls = options.pop("ssl", False)
        (first_host, first_port), *others = target.nodes
        return redis.cluster.RedisCluster(
            # The first node as a url=: only on that path does redis-py (8.1) build each node's
            # pool with connection_class; with startup_nodes alone it hands connection_class to
            # Redis(), which refuses it, and no cluster could be reached at all. The scheme is
            # redis:// for TLS too: the class below is what speaks TLS.
            url=f"redis://{_url_host(first_host)}:{first_port}",
            startup_nodes=[
                redis.cluster.ClusterNode(host, port)  # type: ignore[no-untyped-call]
                for host, port in others
            ],
            retry=Retry(_backoff(), retries=_CLUSTER_RETRIES),
            # the class, not ssl=True (which would make redis-py pick its own SSLConnection)
            connection_class=DeadlineSSLConnection if tls else DeadlineConnection,
            **options,
        )
    return redis.Redis.from_pool(_standalone_pool(target.url, timeout_seconds, max_connections, idle_seconds))


def async_client_for(
    target: RedisTarget | str, timeout_seconds: float = 2.0, *, max_connections: int = MAX_CONNECTIONS
) -> Any:
    """The ``redis.asyncio`` counterpart of :func:`client_for` (for the SDK's async transport):
    at most ``max_connections`` (per node); on one server a caller beyond them waits for one
    (``BlockingConnectionPool``, within the SDK call's ``asyncio.timeout``). Idle connections
    are not closed on this side."""
    if isinstance(target, str):
        target = parse_redis_url(target)
    if target.kind == "sentinel":
        sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(target.nodes),
            sentinel_kwargs={"socket_timeout": timeout_seconds, "socket_connect_timeout": timeout_seconds},
        )
        master = sentinel.master_for(
            target.service_name,
            db=target.db,
            retry=AsyncRetry(_backoff(), retries=_RETRIES),
            **_node_options(target, timeout_seconds, max_connections),
        )
        _close_sentinels_with(master, sentinel.sentinels)
        return master
    if target.kind == "cluster":
        return redis.asyncio.cluster.RedisCluster(
            startup_nodes=[redis.asyncio.cluster.ClusterNode(host, port) for host, port in target.nodes],
            retry=AsyncRetry(_backoff(), retries=_CLUSTER_RETRIES),
            **_node_options(target, timeout_seconds, max_connections),
        )
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        target.url,
        socket_timeout=timeout_seconds,
        socket_connect_timeout=timeout_seconds,
        max_connections=max_connections,
        timeout=timeout_seconds,
        retry=AsyncRetry(_backoff(), retries=_RETRIES),
        health_check_interval=30,
    )
    return redis.asyncio.Redis.from_pool(pool)


def _close_sentinels_with(master: Any, sentinels: list[Any]) -> None:
    """Closing the master client also closes the connections to the sentinels
    (redis-py leaves them open, and asyncio reports each as an unclosed socket)."""
    close_master = master.aclose

    async def aclose(*args: Any, **kwargs: Any) -> None:
        await close_master(*args, **kwargs)
        for sentinel in sentinels:
            await sentinel.aclose()

    master.aclose = aclose


def embedded_client() -> Any:
    import fakeredis  # only needed for the embedded store

    log.warning(EMBEDDED_WARNING)
    return fakeredis.FakeRedis(server=fakeredis.FakeServer())
