"""The defaults the service, the store and the SDK share: one home for each number.

``config.Settings`` defaults to these (``TOKEN_SERVICE_*`` override them for
the service); the store, the SDK's direct transport and its integrations use
them where no setting reaches, so both sides of a deployment agree.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "DEFAULT_TTL_SECONDS",
    "KEY_PREFIX",
    "MAX_BATCH",
    "MAX_LEASE_SECONDS",
    "MAX_RESULT_BYTES",
    "MAX_TTL_SECONDS",
    "RESULT_TTL_SECONDS",
]

KEY_PREFIX = "ts:"  # of every Redis key (TOKEN_SERVICE_KEY_PREFIX)
DEFAULT_TTL_SECONDS = 300  # a token's life when the request gives none
MAX_TTL_SECONDS = 86400
RESULT_TTL_SECONDS = 86400  # SUCCEEDED/FAILED outcomes are kept at least this long
DEFAULT_LEASE_SECONDS = 30  # a begin's lease when the request gives none
MAX_LEASE_SECONDS = 3600
MAX_RESULT_BYTES = 16384  # a stored result or error, as JSON
MAX_BATCH = 1000  # tokens in one /token/generate/batch
# Connections to Redis one client opens at most (a service worker's, an SDK client's: per node
# of a cluster), and how long one stays open unused (TOKEN_SERVICE_REDIS_MAX_CONNECTIONS,
# TOKEN_SERVICE_REDIS_IDLE_SECONDS)
REDIS_MAX_CONNECTIONS = 64
REDIS_IDLE_SECONDS = 60.0
