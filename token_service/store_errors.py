"""What an error from Redis means to the store: Redis cannot answer, Redis refuses us, or a bug of ours.

:mod:`token_service.store` translates at its edge with :func:`unavailable`: every
error that comes from the Redis deployment — down, slow, loading, or refusing
the service's commands because of how it is set up (a database number it does
not have, credentials or ACL permissions it refuses, a read-only replica, a
cluster node reached as a single server, a server that does not speak Redis,
maxmemory, a failed save...) — is a :class:`ServiceUnavailable`: ``503
store_unavailable`` and a failed readiness, fail closed, never a 500. No
setting of Redis or of the service can make a route answer ``500``.

What stays as it is, a bug (``500 internal_error``, logged with its traceback),
is what only our own code can cause: a Lua error raised inside one of our
scripts (:data:`_SCRIPT_FAULT_PREFIXES`), a ``NOSCRIPT`` that escaped the
store's reloading, and redis-py's refusals of what our code asked of it before
anything was sent (``DataError``, a transaction across slots).

The ``detail`` of the error is a fixed sentence per kind of refusal, with the
reply's code (``NOPERM``, ``MISCONF``, ``ERR``...): the 503's body and
``/readyz`` say what to fix without echoing what the server wrote (a user
name, a host). Redis's own words stay on the cause (``raise ... from exc``),
which ``token-service check`` prints.
"""

from __future__ import annotations

from redis import exceptions as redis_errors

from token_service.errors import ServiceUnavailable

__all__ = ["unavailable"]

# "Redis cannot answer now": the connection, the time it took, or a state that passes.
_TRANSIENT: tuple[type[Exception], ...] = (
    redis_errors.TimeoutError,
    redis_errors.BusyLoadingError,  # LOADING: a restart reading its dataset
    redis_errors.MasterDownError,
    redis_errors.ClusterDownError,
    redis_errors.TryAgainError,
    # a cluster slot with no reachable owner (not a RedisError subclass)
    redis_errors.SlotNotCoveredError,
)
# Prefixes of replies, as redis-py hands them over, that mean a state which passes on its own
# (a script running past lua-time-limit); the other refusals need someone to change something.
_TRANSIENT_REPLY_PREFIXES = ("BUSY ",)

# A Lua error inside one of our scripts, as Redis 7 ("user_script:12: attempt to ...") and the
# embedded store (fakeredis: "Error running script (call to f_...): @user_script:?: ...") word
# it: a bug in lua/ or in the arguments we pass, which no setting causes. Refusals of the
# commands a script calls are worded otherwise (NOPERM's "The user executing the script can't
# run this command", "OOM command not allowed", "READONLY ...", a key of another kind's
# WRONGTYPE) and are translated as the same refusals outside a script are.
_SCRIPT_FAULT_PREFIXES = (
    "user_script:",
    "Error running script",
    "Error compiling script",
    "Wrong number of args calling Redis command from script",
)
# redis-py's refusals of what our code asked of it, before anything reached Redis. Looked up by
# name: the floor (redis-py 5.3) has no CrossSlotTransactionError or InvalidPipelineStack, which
# later releases raise for the same mistakes.
_OUR_FAULTS: tuple[type[Exception], ...] = tuple(
    getattr(redis_errors, name)
    for name in (
        "DataError",
        "NoScriptError",  # the store reloads its scripts: one escaping is a bug there
        "CrossSlotTransactionError",
        "InvalidPipelineStack",
        "WatchError",
        "PubSubError",
        "LockError",
    )
    if hasattr(redis_errors, name)
)

# The code of a reply whose class redis-py names (it strips the code off the message).
_CODE_OF: tuple[tuple[type[Exception], str], ...] = (
    (redis_errors.NoPermissionError, "NOPERM"),
    (redis_errors.ReadOnlyError, "READONLY"),
    (redis_errors.OutOfMemoryError, "OOM"),
    (redis_errors.MovedError, "MOVED"),
    (redis_errors.AskError, "ASK"),
    (redis_errors.ClusterCrossSlotError, "CROSSSLOT"),
)
_ACL = "the Redis user lacks a permission the service needs (its ACL: the commands, or the key prefix)"
_CLUSTER_NODE = "this Redis is a cluster node: reach a cluster with a redis+cluster:// URL"
# What a refusal means, by the reply's code; then by words of its message (for ERR's).
_MEANING_BY_CODE = {
    "NOPERM": _ACL,
    "READONLY": "this Redis is a read-only replica: the URL must name the master",
    "OOM": "Redis is at maxmemory and evicts nothing (maxmemory-policy noeviction)",
    "MISCONF": "Redis failed to save to disk and refuses writes (stop-writes-on-bgsave-error)",
    "NOREPLICAS": "too few replicas acknowledge writes (min-replicas-to-write)",
    "DENIED": "Redis is in protected mode and refuses remote clients",
    "MOVED": _CLUSTER_NODE,
    "ASK": _CLUSTER_NODE,
    "CROSSSLOT": _CLUSTER_NODE,
    "WRONGTYPE": "a key under the service's key prefix holds another application's data",
}
# Codes redis-py leaves on the message (it has no class for them)
_UNCLASSED_CODES = frozenset({*_MEANING_BY_CODE, "EXECABORT", "BUSYKEY", "NOTBUSY", "UNKILLABLE", "NOPROTO"})
_MEANING_BY_WORDS = (
    ("db index", "the Redis URL names a database number this server does not have"),
    ("can't run this command", _ACL),
    ("no permissions", _ACL),
    ("unknown command", "Redis does not know a command the service needs (renamed or disabled?)"),
)


def _code(exc: redis_errors.ResponseError) -> str:
    for cls, code in _CODE_OF:
        if isinstance(exc, cls):
            return code
    first = str(exc).split(" ", 1)[0]
    # an error redis-py has no class for keeps its code ("MISCONF ..."); ERR's is stripped off
    return first if first in _UNCLASSED_CODES else "ERR"


def _refused(code: str, message: str) -> ServiceUnavailable:
    meaning = _MEANING_BY_CODE.get(code)
    if meaning is None:
        lowered = message.lower()
        meaning = next(
            (said for words, said in _MEANING_BY_WORDS if words in lowered),
            "Redis refuses a command the service needs",
        )
    return ServiceUnavailable(f"Redis refused the command ({code}): {meaning}.")


def unavailable(exc: BaseException) -> ServiceUnavailable | None:
    """The ServiceUnavailable an error from Redis means, or None for a bug of ours: it passes."""
    if isinstance(exc, _OUR_FAULTS):
        return None
    if isinstance(exc, _TRANSIENT):
        return ServiceUnavailable(f"Redis is unavailable: {type(exc).__name__}.")
    if isinstance(exc, redis_errors.AuthenticationError):
        # WRONGPASS, NOAUTH, "invalid password": a ConnectionError to redis-py, a setting to fix
        return ServiceUnavailable(
            "Redis refused the credentials (AUTH): the Redis URL's user name or password is wrong or missing."
        )
    if isinstance(exc, redis_errors.ConnectionError):
        return ServiceUnavailable(f"Redis is unavailable: {type(exc).__name__}.")
    if isinstance(exc, redis_errors.InvalidResponse):
        return ServiceUnavailable(
            "Redis is unavailable: the Redis URL names a server that does not speak the Redis protocol."
        )
    if isinstance(exc, redis_errors.ResponseError):
        message = str(exc)
        if message.startswith(_SCRIPT_FAULT_PREFIXES):
            return None
        if message.startswith(_TRANSIENT_REPLY_PREFIXES):
            return ServiceUnavailable(f"Redis is unavailable: {message.split(' ', 1)[0]}.")
        return _refused(_code(exc), message)
    if isinstance(exc, redis_errors.RedisClusterException):
        cause = exc.__cause__
        if type(cause) in (redis_errors.ConnectionError, redis_errors.TimeoutError):
            # "Redis Cluster cannot be connected": no node answered the slot-map refresh
            return ServiceUnavailable("Redis is unavailable: no cluster node answers.")
        if isinstance(cause, redis_errors.RedisError):
            return unavailable(cause)  # what the nodes said: a wrong password, an ACL...
        if cause is not None and not isinstance(cause, redis_errors.RedisClusterException):
            # redis-py wraps whatever made every startup node fail, our own TypeError included:
            # a bug of ours is not a cluster that refuses
            return None
        return ServiceUnavailable(
            "Redis refused the command (CLUSTER): the redis+cluster:// URL names no usable cluster "
            "(a Redis without cluster mode?)."
        )
    if isinstance(exc, redis_errors.RedisError):
        return ServiceUnavailable(f"Redis is unavailable: {type(exc).__name__}.")
    return None
