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
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from token_service.config import RedisTarget, Settings, parse_redis_url

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


def redis_client(settings: Settings) -> Any:
    if settings.redis_client is not None:
        return settings.redis_client
    if settings.embedded:
        return embedded_client()
    return client_for(settings.redis_target, settings.redis_timeout_seconds)


def _backoff() -> ExponentialBackoff:
    return ExponentialBackoff(cap=0.2, base=0.02)


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


def client_for(target: RedisTarget | str, timeout_seconds: float = 2.0) -> Any:
    """A sync redis-py client for a URL or parsed target (standalone, Sentinel or Cluster)."""
    if isinstance(target, str):
        target = parse_redis_url(target)
    if target.kind == "sentinel":
        sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(target.nodes),
            sentinel_kwargs={"socket_timeout": timeout_seconds, "socket_connect_timeout": timeout_seconds},
        )
        return sentinel.master_for(  # type: ignore[no-untyped-call]
            target.service_name,
            db=target.db,
            retry=Retry(_backoff(), retries=_RETRIES),
            **_node_options(target, timeout_seconds),
        )
    if target.kind == "cluster":
        return redis.cluster.RedisCluster(
            startup_nodes=[
                redis.cluster.ClusterNode(host, port)  # type: ignore[no-untyped-call]
                for host, port in target.nodes
            ],
            retry=Retry(_backoff(), retries=_CLUSTER_RETRIES),
            **_node_options(target, timeout_seconds),
        )
    return redis.Redis.from_url(
        target.url,
        socket_timeout=timeout_seconds,
        socket_connect_timeout=timeout_seconds,
        max_connections=MAX_CONNECTIONS,
        retry=Retry(_backoff(), retries=_RETRIES),
        health_check_interval=30,
    )


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
