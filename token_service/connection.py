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

from token_service import deadline
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
# Connections one client may open (per node). Under gevent workers every request is a
# greenlet and up to worker_connections (1000) of them may wait on Redis at once; redis-py's
# own default (100 in current releases) would refuse the 101st with MaxConnectionsError, a 503.
MAX_CONNECTIONS = 2048


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
    return client_for(settings.redis_target, settings.redis_timeout_seconds)


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


def _standalone_pool(url: str, timeout_seconds: float) -> redis.ConnectionPool:
    pool = redis.ConnectionPool.from_url(
        url,
        socket_timeout=timeout_seconds,
        socket_connect_timeout=timeout_seconds,
        max_connections=MAX_CONNECTIONS,
        retry=Retry(_backoff(), retries=_RETRIES),
        health_check_interval=30,
    )
    # the class the URL's scheme chose (TCP, TLS, Unix socket), keeping to the deadline
    pool.connection_class = _WITHIN_DEADLINE.get(pool.connection_class, pool.connection_class)
    return pool


def _node_options(target: RedisTarget, timeout_seconds: float) -> dict[str, Any]:
    options: dict[str, Any] = {
        "socket_timeout": timeout_seconds,
        "socket_connect_timeout": timeout_seconds,
        "max_connections": MAX_CONNECTIONS,
        "username": target.username,
        "password": target.password,
    }
    if target.ssl:
        options["ssl"] = True
    return options


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host  # an IPv6 address, bracketed as a URL writes it


def client_for(target: RedisTarget | str, timeout_seconds: float = 2.0) -> Any:
    """A sync redis-py client for a URL or parsed target (standalone, Sentinel or Cluster)."""
    if isinstance(target, str):
        target = parse_redis_url(target)
    if target.kind == "sentinel":
        sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(target.nodes),
            sentinel_kwargs={"socket_timeout": timeout_seconds, "socket_connect_timeout": timeout_seconds},
        )
        options = _node_options(target, timeout_seconds)
        tls = options.pop("ssl", False)
        return sentinel.master_for(  # type: ignore[no-untyped-call]
            target.service_name,
            db=target.db,
            retry=Retry(_backoff(), retries=_RETRIES),
            connection_class=DeadlineSentinelSSLConnection if tls else DeadlineSentinelConnection,
            **options,
        )
    if target.kind == "cluster":
        options = _node_options(target, timeout_seconds)
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
    return redis.Redis.from_pool(_standalone_pool(target.url, timeout_seconds))


def async_client_for(target: RedisTarget | str, timeout_seconds: float = 2.0) -> Any:
    """The ``redis.asyncio`` counterpart of :func:`client_for` (for the SDK's async transport)."""
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
            **_node_options(target, timeout_seconds),
        )
        _close_sentinels_with(master, sentinel.sentinels)
        return master
    if target.kind == "cluster":
        return redis.asyncio.cluster.RedisCluster(
            startup_nodes=[redis.asyncio.cluster.ClusterNode(host, port) for host, port in target.nodes],
            retry=AsyncRetry(_backoff(), retries=_CLUSTER_RETRIES),
            **_node_options(target, timeout_seconds),
        )
    return redis.asyncio.Redis.from_url(
        target.url,
        socket_timeout=timeout_seconds,
        socket_connect_timeout=timeout_seconds,
        retry=AsyncRetry(_backoff(), retries=_RETRIES),
        health_check_interval=30,
    )


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
