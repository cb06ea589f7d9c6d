"""Build the Redis client the store runs on, from the configuration.

``TOKEN_SERVICE_REDIS_URL`` empty means the embedded in-memory store
(fakeredis with Lua): for trying the service out in one process, never for
production — nothing survives a restart and workers would not share it.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from token_service.config import Settings

log = logging.getLogger(__name__)

EMBEDDED_WARNING = (
    "TOKEN_SERVICE_REDIS_URL is not set: running on the EMBEDDED IN-MEMORY STORE. "
    "Tokens live in this one process and are lost on restart. Do not use this in production."
)


def redis_client(settings: Settings) -> Any:
    if settings.redis_client is not None:
        return settings.redis_client
    if settings.embedded:
        return embedded_client()
    return redis.Redis.from_url(
        settings.redis_url,
        socket_timeout=settings.redis_timeout_seconds,
        socket_connect_timeout=settings.redis_timeout_seconds,
        # One quick retry absorbs a reset connection. It is safe for every
        # script: consume/begin carry a request id, the rest are idempotent.
        retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), retries=1),
        health_check_interval=30,
    )


def embedded_client() -> Any:
    import fakeredis  # only needed for the embedded store

    log.warning(EMBEDDED_WARNING)
    return fakeredis.FakeRedis(server=fakeredis.FakeServer())
