"""The token operations on Redis: one Lua script per operation, Redis errors translated at this edge.

Each operation runs its script of ``lua/`` (as :mod:`token_service.scripts`
links it) by SHA. A ``NOSCRIPT`` (Redis restarted, ``SCRIPT FLUSH``) is
handled here, not left to redis-py: the sync store sends ``EVALSHA`` below
redis-py's ``Script.__call__`` (which would reload it) to save its per-call
cost, so :meth:`TokenStore._call` loads the script and runs it again, and
``EVAL`` runs it when a second flush wins that race; a pipeline
(``_issue_pipelined``) redoes just the calls that got ``NOSCRIPT``. The asyncio
store calls ``Script`` and only adds the ``EVAL`` fallback.

Redis failures are translated here into :class:`ServiceUnavailable`: callers
never see a redis-py exception (:mod:`token_service.store_errors` says which
error means what: every refusal of a misconfigured Redis too, never a 500).
Sync (:class:`TokenStore`) and asyncio (:class:`AsyncTokenStore`) variants
share :mod:`token_service.records`, so a reply means the same thing to the
service and to every SDK transport.

A store built with an ``observer`` (:data:`Observer`) calls it once per
operation, when its script has answered or failed (``_observed``, the one
place that does): the service's metrics count what each operation did, and
its access log names the token, this way. Without an observer an operation
pays one ``is not None`` test for it.

This is the code that talks to Redis for token records. Two other modules do
too, on the same records and scripts (linked by :mod:`token_service.scripts`, errors
through :func:`translate_errors`): :mod:`token_service.client._idempotency_store` (an
Idempotency-Key's record, a keyed one under its own key) and :mod:`token_service.ops.admin`
(an operator's listing, revoking and releasing); :mod:`token_service.connection`
builds the clients all three use.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis import exceptions as redis_errors
from redis.crc import key_slot

from token_service import defaults, records, store_errors
from token_service.limits import (
    IssuanceLimits,
    MemoryReading,
    admit_reply,
    budget_key,
    client_key_of,
    client_tag,
    parse_budget_record,
    token_bytes,
)
from token_service.records import IssueRequest, UseRequest
from token_service.scripts import ADMIT_ISSUE, SCRIPT_NAMES, admit_issue_source, lua_source
from token_service.tokens import (
    digest_key,
    new_lease_id,
    new_request_id,
    new_tokens,
    record_key,
    token_digest,
)

__all__ = ["READY_PROBE_MS", "AsyncTokenStore", "Observer", "TokenStore", "translate_errors"]

log = logging.getLogger(__name__)

# Where consume, begin and revoke put the bucket a token still has to be released from
# (Cluster only: elsewhere the script releases it itself, see release() in lua/_record.lua).
_BUCKET_AT = {"consume": 2, "begin": 4, "revoke": 1}
# readiness writes one small key that lives this long (store.ready)
READY_PROBE_MS = 10_000
# plain keyed claims a store remembers at once for complete.lua's fast path (_remember_claim)
_MAX_CLAIMS = 4096

T = TypeVar("T")
P = ParamSpec("P")

# What a store tells its observer after each operation, succeeded or not: the name of the
# script it ran ("consume", "begin", ..., "issue", "admit", "admit+issue"), the request's
# scope (None where the operation carries none), the digest of the token it named (None for
# issue and admit, which name none: tokens.token_digest, the record key's last part), and
# what the operation returned or the exception it raised.
Observer = Callable[[str, str | None, str | None, Any], None]

# Every error from the Redis deployment (down, or refusing us for how it is set up) → the
# ServiceUnavailable it means; a fault of our own scripts or code → None (store_errors says which).
_unavailable = store_errors.unavailable


class _TranslateErrors:
    """Errors from Redis → ServiceUnavailable (:func:`store_errors.unavailable`); our own bugs pass.

    A class, not ``@contextlib.contextmanager``: it wraps every Redis call, and
    one stateless instance costs a tenth of a generator-based manager per use.
    (The per-token operations use ``try``/``except`` with :func:`_unavailable`
    instead: cheaper still on success, the same translation on failure.)
    """

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> Literal[False]:
        if exc is not None:
            unavailable = _unavailable(exc)
            if unavailable is not None:
                raise unavailable from exc
        return False


_TRANSLATE_ERRORS = _TranslateErrors()


def translate_errors() -> _TranslateErrors:
    return _TRANSLATE_ERRORS


def _collisions(reply: Any) -> set[int]:
    """Indexes (0-based) of the keys one issue call found taken; raises what the script reported."""
    records.raise_for(reply)
    if records.text(reply[0]) == "issued":
        return set()
    return {int(index) - 1 for index in reply[1:]}


def _collisions_each(replies: Sequence[Any]) -> set[int]:
    """The same for a pipeline of one-key issue calls."""
    return {i for i, reply in enumerate(replies) if _collisions(reply)}


def _keep(tokens: list[str], collided: set[int]) -> list[str]:
    # a 128-bit digest collision is astronomically unlikely; the caller draws again if it happens
    return [token for i, token in enumerate(tokens) if i not in collided] if collided else tokens


def _bucket(name: str, reply: Any) -> str:
    """The bucket a consume, begin or revoke left for the caller to release ('' for none)."""
    at = _BUCKET_AT.get(name)
    if at is None or not isinstance(reply, list) or len(reply) <= at:
        return ""
    return records.text(reply[at])


def _begin_reader(args: list[str]) -> Callable[[Any], records.Started | records.Finished]:
    """begin.lua's reply read against the arguments it answers (its bare answers need them)."""
    return lambda reply: records.begin_reply(reply, args)


def _claim_unsupported(exc: BaseException) -> bool:
    """Redis 6.2 refuses SET with both NX and GET (a syntax error); 7.0 takes it."""
    return isinstance(exc, redis_errors.ResponseError) and "syntax" in str(exc).lower()


def _other_slot(key: str) -> str:
    """A key whose Cluster hash slot is not ``key``'s (readiness's probe of a cluster node)."""
    slot = key_slot(key.encode())
    return next(other for n in range(16) if key_slot((other := f"{key}:{n}").encode()) != slot)


def _memory(info: Any) -> tuple[int, int]:
    """(used_memory, maxmemory) of one ``INFO memory`` reply (0: no maxmemory, or not said)."""
    return int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))


def _raise_first_error(replies: Sequence[Any]) -> None:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply


class _StoreBase:
    def __init__(
        self,
        *,
        key_prefix: str = defaults.KEY_PREFIX,
        result_ttl_seconds: int = defaults.RESULT_TTL_SECONDS,
        clock_ms: Callable[[], int] | None = None,
        observer: Observer | None = None,
    ) -> None:
        self.key_prefix = key_prefix
        self._budget_key = budget_key(key_prefix)
        self.result_ttl_seconds = result_ttl_seconds
        self._cluster = False
        # Tests may control time for leases; in production Redis's clock decides.
        self._clock_ms = clock_ms
        self._observe = observer
        # A keyed begin is one plain SET NX GET (Redis >= 7.0), not begin.lua. A store whose
        # time a test controls claims in begin.lua, which takes "now" as an argument: a key's
        # own expiry runs on real time.
        self._plain_claim = clock_ms is None
        # lease id -> the record its plain claim wrote, for complete.lua's fast path (see _claimed)
        self._claims: dict[str, str] = {}
        self._last_key: tuple[object, str] = (object(), "")  # the last token _keys digested, its key

    def _claim_failed(self, exc: Exception) -> None:
        """A keyed claim's ``SET NX GET`` failed: returns when Redis is older than 7.0, which
        refuses NX with GET (begin.lua claims instead, from now on); else raises the store's
        error (ServiceUnavailable when Redis cannot answer)."""
        if _claim_unsupported(exc):
            self._plain_claim = False
            return
        unavailable = _unavailable(exc)
        if unavailable is None:
            raise exc
        raise unavailable from exc

    def _claim_command(
        self, use: UseRequest, lease_seconds: int, digest: str | None
    ) -> tuple[tuple[Any, ...], str, str]:
        """The plain keyed claim's ``SET key <PROCESSING> NX GET PX lease`` (its value at index 2),
        with the lease id and request id that value holds: one shape for both stores."""
        lease_id = new_lease_id()
        request_id = use.request_id or new_request_id()
        key = self.key(use.token) if digest is None else digest_key(self.key_prefix, digest)
        value = records.claim_value(use, lease_id, request_id)
        return ("SET", key, value, "NX", "GET", "PX", lease_seconds * 1000), lease_id, request_id

    def _claim_decided(
        self,
        previous: Any,
        use: UseRequest,
        lease_id: str,
        lease_seconds: int,
        value: str,
        request_id: str,
        claim_ttl_seconds: int,
    ) -> records.Started | records.Finished | list[str]:
        """What the record the claim's SET found (``previous``) decides alone: a first claim, a
        replay, a refusal; else the arguments of the begin.lua that decides (released, another
        holder, a lost-reply retry, an old-format record), with this claim's lease and request ids."""
        decided = records.claim_reply(previous, use, lease_id, lease_seconds)
        if decided is None:
            use = UseRequest(use.token, use.scope, use.subject, use.fingerprint, request_id)
            return records.begin_args(use, lease_seconds, lease_id, self._now(), claim_ttl_seconds)
        if previous is None:
            self._remember_claim(lease_id, value)
        return decided

    def _remember_claim(self, lease_id: str, value: str) -> None:
        """A plain claim's record, kept until its complete or fail. Only a shortcut: a complete
        without it takes the script's usual path, so a full memo is simply emptied (claims held
        past that many at once in one store, or never finished, are the ones forgotten)."""
        claims = self._claims
        if len(claims) >= _MAX_CLAIMS:
            claims.clear()
        claims[lease_id] = value

    def _claimed(self, lease_id: str) -> str | None:
        return self._claims.pop(lease_id, None)

    def _now(self) -> str:
        return str(self._clock_ms()) if self._clock_ms else ""

    def _limiter_now(self) -> str:
        """The issuance limiter runs on the service's clock, not Redis's (docs/configuration.md).

        Redis's TIME costs the limiter's script a sixth of its budget; the limits
        only need instances whose clocks agree to within a second or so (NTP),
        and a skew shifts them by no more than the skew.
        """
        return str(self._clock_ms() if self._clock_ms else int(time.time() * 1000))

    def key(self, token: str) -> str:
        return record_key(self.key_prefix, token)

    def _keys(self, name: str, token: str, digest: str | None) -> list[str]:
        """KEYS of a per-token script: the record (its key from ``digest`` if the caller made
        it already); for consume, begin and revoke also the client's limit record if one
        counts the token (not on Cluster, where it lives in another slot: see _release)."""
        if digest is not None:
            key = digest_key(self.key_prefix, digest)
        else:
            # A guard's begin and its complete name the same token (the same str): digested once.
            # One (token, key) pair, replaced whole, so another thread's never mixes with it.
            last = self._last_key
            if last[0] is token:
                key = last[1]
            else:
                key = record_key(self.key_prefix, token)
                self._last_key = (token, key)
        if name not in _BUCKET_AT:
            return [key]
        client_key = None if self._cluster else client_key_of(self.key_prefix, token)
        return [key, client_key, self._budget_key] if client_key else [key]

    # What renew, complete, fail, inspect and revoke send, said once for both stores: each makes
    # them its operations (_operation, _async_operation), which differ only in awaiting the script.

    def _renew_args(self, lease_id: str, lease_seconds: int = defaults.DEFAULT_LEASE_SECONDS) -> list[str]:
        """Extend the live lease to ``lease_seconds`` from now (never shorter); LeaseLost if not live."""
        return records.renew_args(lease_id, lease_seconds, self._now())

    def _complete_args(self, lease_id: str, result: Any, keep_seconds: int | None = None) -> list[str]:
        """Store the result, kept ``keep_seconds`` (default result_ttl_seconds) or the token's life."""
        keep = self.result_ttl_seconds if keep_seconds is None else keep_seconds
        return records.complete_args(lease_id, result, keep, self._now(), self._claimed(lease_id))

    def _fail_args(
        self, lease_id: str, *, retryable: bool, error: Any = None, keep_seconds: int | None = None
    ) -> list[str]:
        """Record a failure: ``retryable`` frees the token for a retry, else it is terminal
        (``error`` kept ``keep_seconds``, default result_ttl_seconds)."""
        keep = self.result_ttl_seconds if keep_seconds is None else keep_seconds
        self._claims.pop(lease_id, None)  # fail.lua has no fast path: the claim is forgotten
        return records.fail_args(lease_id, retryable, error, keep, self._now())

    def _inspect_args(self) -> list[str]:
        """The token's record as it is now (state, lease, result), without changing it."""
        return [self._now()]

    def _revoke_args(self) -> list[str]:
        """Delete the token's record, whatever its state (TokenInvalid: there was none)."""
        return []


def _operation(
    name: str, build: Callable[Concatenate[_StoreBase, P], list[str]], read: Callable[[Any], T]
) -> Callable[Concatenate[TokenStore, str, P], T]:
    """The TokenStore operation that runs script ``name`` on a token with what ``build`` sends and
    ``read``s its reply (observed when the store has an observer); its docstring is ``build``'s."""

    def operation(self: TokenStore, token: str, /, *args: P.args, **kwargs: P.kwargs) -> T:
        sent = build(self, *args, **kwargs)
        if self._observe is not None:
            return self._observed_run(name, token, sent, read)
        return self._run(name, token, sent, read)

    operation.__name__ = operation.__qualname__ = name
    operation.__doc__ = build.__doc__
    return operation


def _async_operation(
    name: str, build: Callable[Concatenate[_StoreBase, P], list[str]], read: Callable[[Any], T]
) -> Callable[Concatenate[AsyncTokenStore, str, P], Awaitable[T]]:
    """:func:`_operation` for AsyncTokenStore."""

    async def operation(self: AsyncTokenStore, token: str, /, *args: P.args, **kwargs: P.kwargs) -> T:
        sent = build(self, *args, **kwargs)
        if self._observe is not None:
            return await self._observed_run(name, token, sent, read)
        return await self._run(name, token, sent, read)

    operation.__name__ = operation.__qualname__ = name
    operation.__doc__ = build.__doc__
    return operation


# redis-py's packer when hiredis is installed: it packs with hiredis.pack_command, after a pass
# over the arguments for bytearrays and memoryviews and a split of a first one with spaces.
try:
    from hiredis import pack_command as _pack_command
except ImportError:  # no hiredis: redis-py packs in Python, and send_command does
    _HIREDIS_PACKER = None
else:
    _HIREDIS_PACKER = getattr(redis.connection, "HiredisRespSerializer", None)


def _send_and_read(conn: Any, command: tuple[Any, ...]) -> Any:
    """``conn.send_command(*command)`` then its reply. The store's commands are a command name and
    str arguments, so where redis-py would pack them with hiredis they go to hiredis directly: the
    pass over the arguments cost a generate's EVALSHA (22 arguments) ~10 k instructions."""
    packer = getattr(conn, "_command_packer", None)
    if packer is not None and type(packer) is _HIREDIS_PACKER:
        try:
            packed = [_pack_command(command)]
        except TypeError:  # an argument hiredis cannot pack: redis-py's own path says so
            packed = packer.pack(*command)
        conn.send_packed_command(packed)
    else:
        conn.send_command(*command)
    return conn.read_response()


_SHOULD_RECONNECT = hasattr(redis.connection.AbstractConnection, "should_reconnect")

# Forks seen by this process: a connection parked before a fork belongs to the parent.
_forks = [0]
os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


# A Retry's count of retries (negative: unbounded): get_retries() is redis-py >= 6 only
_GET_RETRIES = hasattr(redis.retry.Retry, "get_retries")


def _release(pool: Any, conn: Any) -> None:
    """Back to the pool, as execute_command hands it back."""
    try:
        if _SHOULD_RECONNECT and conn.should_reconnect():
            conn.disconnect()  # the server announced a move: reconnect on next use
    finally:
        pool.release(conn)


# Connections a store parks at most. One per concurrent caller: a gevent worker's greenlets or
# a threaded worker's threads would otherwise find the one parked connection taken and check
# one out of the pool, a cost on every request (docs/performance.md).
_MAX_PARKED = 8


def _unpark(pool: Any, parked: list[tuple[int, Any]]) -> None:
    while parked:
        generation, conn = parked.pop()
        if generation == _forks[0]:
            pool.release(conn)


class TokenStore(_StoreBase):
    """Token operations on a (sync) redis-py client, one Lua script each."""

    def __init__(self, client: redis.Redis, **options: Any) -> None:
        super().__init__(**options)
        self.client = client
        self._cluster = isinstance(client, redis.cluster.RedisCluster)
        self._scripts = {name: client.register_script(lua_source(name)) for name in SCRIPT_NAMES}
        if not self._cluster:
            self._scripts[ADMIT_ISSUE] = client.register_script(admit_issue_source())
        # A plain client with a plain pool: EVALSHA on a pooled connection directly (see _execute).
        plain = type(client) is redis.Redis and client.connection is None
        self._pool = client.connection_pool if plain else None
        pool = client.connection_pool if plain else None
        # a pool that closes idle connections (connection.BoundedPool) asks for the parked ones
        reaps = hasattr(pool, "add_idle_hook")
        self._parking = plain and (type(pool) is redis.ConnectionPool or reaps)
        # at most _MAX_PARKED (fork generation, connection): one per call in flight at once
        self._parked: list[tuple[int, Any]] = []
        if self._parking:
            # a store dropped while it holds a connection hands it back to the pool
            weakref.finalize(self, _unpark, pool, self._parked)
            if reaps:
                pool.add_idle_hook(self._hand_back_parked)  # type: ignore[union-attr]

    def _hand_back_parked(self) -> None:
        """Every parked connection back to the pool (its idle reaper's round): a busy store
        takes one out again on its next call, an idle one's is closed with the pool's."""
        _unpark(self.client.connection_pool, self._parked)

    def _execute(self, command: tuple[Any, ...], **options: Any) -> Any:
        """One command (a script's EVALSHA, the plain keyed claim's SET) through redis-py's
        connection layer without its command layer; ``options`` are for redis-py's reply
        parser, where the client's ``execute_command`` reads the reply.

        The same connection-level Retry (its attempts, backoff and errors; the
        connection is dropped after a failure, so a late reply is never read as
        the next command's), health checks and reply parsing as
        ``execute_command``, minus its per-command wrapping (observability
        hooks, closures, event dispatch): a measurable share of the client CPU
        of a token operation (docs/performance.md has the current figures).
        And on a plain ``ConnectionPool``, the connection of a call that
        succeeded is parked here for the next one instead of going back to the
        pool: checking a connection out of redis-py's pool (locks, a poll of
        the socket, bookkeeping) costs about as much again. The store holds at
        most :data:`_MAX_PARKED` connections, one per call in flight at the same
        time (greenlets, threads); one that failed goes back to the pool
        (dropped first unless the failure was an error reply), a parked one is
        never used in a forked child, and none is parked when the connection's
        Retry allows no retry (the pool's checkout check is then what replaces
        a connection the server closed). Clients of other kinds (Cluster,
        Sentinel, a blocking pool, a single-connection client, fakeredis) take
        ``execute_command``, or at least the pool's checkout every call.
        """
        pool = self._pool
        if pool is None:
            return self.client.execute_command(*command, **options)  # type: ignore[no-untyped-call]
        parked = self._parked
        try:
            generation, conn = parked.pop()  # atomic: two threads never take the same one
            if generation != _forks[0]:
                raise IndexError  # the parent's connection: the child's pool makes its own
        except IndexError:
            conn = pool.get_connection()
        try:
            reply = conn.retry.call_with_retry(
                lambda: _send_and_read(conn, command), lambda error: conn.disconnect()
            )
        except BaseException as exc:
            if not isinstance(exc, redis_errors.ResponseError):
                # Only an error reply leaves the connection in step. Anything else may have
                # struck between the send and the read (KeyboardInterrupt, a task's time
                # limit, a signal's exception) and left a reply unread: drop the connection,
                # or the next call would read this one's reply.
                conn.disconnect()
            _release(pool, conn)
            raise
        # Parked only where a failure of the parked connection is retried: it skips the
        # pool's checkout, whose check of the socket would have replaced a connection the
        # server closed meanwhile (idle timeout, CLIENT KILL, restart).
        if (
            self._parking
            and len(parked) < _MAX_PARKED
            and (conn.retry.get_retries() if _GET_RETRIES else conn.retry._retries) != 0
            and not (_SHOULD_RECONNECT and conn.should_reconnect())
        ):
            parked.append((_forks[0], conn))
        else:
            _release(pool, conn)
        return reply

    def _call(self, name: str, keys: Sequence[str], args: Sequence[str]) -> Any:
        # EVALSHA straight from the client: what redis-py's Script.__call__ does, without
        # its per-call import, Pipeline check and argument tuples.
        script = self._scripts[name]
        try:
            return self._execute(("EVALSHA", script.sha, len(keys), *keys, *args))
        except redis_errors.NoScriptError:
            pass  # Redis restarted or its scripts were flushed: load it (as Script would), run again
        return self._reload_and_call(script, keys, args)

    def _reload_and_call(self, script: Any, keys: Sequence[str], args: Sequence[str]) -> Any:
        client = self.client
        try:
            client.script_load(script.script)
            return client.evalsha(script.sha, len(keys), *keys, *args)
        except redis_errors.NoScriptError:
            # the reload lost a race with another flush or restart; EVAL loads and runs in one step.
            return client.eval(script.script, len(keys), *keys, *args)

    def _run(
        self, name: str, token: str, args: Sequence[str], read: Callable[[Any], T], digest: str | None = None
    ) -> T:
        """Run a per-token script and ``read`` its reply (records' decoder: the outcome, or the
        TokenError its code means)."""
        # translate_errors(), as try/except: nothing to enter or exit when Redis answers
        try:
            reply = self._call(name, self._keys(name, token, digest), args)
        except Exception as exc:
            unavailable = _unavailable(exc)
            if unavailable is None:
                raise
            raise unavailable from exc
        if self._cluster:
            self._release(name, token, reply)
        return read(reply)

    def _observed_run(
        self, name: str, token: str, args: Sequence[str], read: Callable[[Any], T], scope: str | None = None
    ) -> T:
        """A per-token operation, observed: the token digested once, for its record key and
        for the observer (the service's access log names the token by that digest)."""
        digest = token_digest(token)
        return self._observed(name, scope, digest, self._run, name, token, args, read, digest)

    def _observed(
        self,
        name: str,
        scope: str | None,
        digest: str | None,
        run: Callable[P, T],
        *args: P.args,
        **kw: P.kwargs,
    ) -> T:
        """``run(*args)``, and the observer told what came of it: the one place a store does."""
        observe = self._observe
        assert observe is not None  # the operation checked
        try:
            outcome = run(*args, **kw)
        except BaseException as error:  # an error reply, Redis down, or a timeout's exception
            observe(name, scope, digest, error)
            raise
        observe(name, scope, digest, outcome)
        return outcome

    def _release(self, name: str, token: str, reply: Any) -> None:
        """Cluster: take the token out of its client's count, a second call in the client's slot.

        The operation itself is done: a failure here must not turn its reply into
        a 503 (a caller would retry a consume that happened). The token then
        counts until its bucket ends, as an expired one does.
        """
        bucket = _bucket(name, reply)
        client_key = client_key_of(self.key_prefix, token) if bucket else None
        if client_key is None:
            return
        try:
            self._call("release", [client_key, self._budget_key], [bucket])
        except Exception as exc:
            if _unavailable(exc) is None:
                raise
            log.warning("a token's outstanding-cap slot was not released (Redis unavailable)")

    def issue(self, request: IssueRequest, count: int = 1) -> list[str]:
        """Issue ``count`` tokens in one round trip; returns the raw tokens (never stored)."""
        if self._observe is not None:
            return self._observed("issue", request.scope, None, self._issue, request, count)
        return self._issue(request, count)

    def _issue(self, request: IssueRequest, count: int, client_key: str = "", bucket: str = "") -> list[str]:
        issued: list[str] = []
        args = request.args(bucket)
        # a token counted in a client's cap (a bucket) carries the client's id
        suffix = client_tag(client_key) if bucket else ""
        while len(issued) < count:
            tokens, keys = new_tokens(count - len(issued), suffix, self.key_prefix)
            with translate_errors():
                if len(tokens) == 1 or not self._cluster:
                    collided = _collisions(self._call("issue", keys, args))
                else:
                    collided = _collisions_each(self._issue_pipelined(keys, args))
            issued += _keep(tokens, collided)
        return issued

    def _issue_pipelined(self, keys: list[str], args: Sequence[str]) -> list[Any]:
        script = self._scripts["issue"]

        # EVALSHA is sent by command name: redis-py's ClusterPipeline refuses its
        # evalsha() method but routes the command by its key like any other, and a
        # pipeline without registered scripts skips a SCRIPT EXISTS round trip.
        def send(indexes: Sequence[int], command: str, body: str) -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for i in indexes:
                pipe.execute_command(command, body, "1", keys[i], *args)  # type: ignore[no-untyped-call]
            return list(pipe.execute(raise_on_error=False))

        replies = send(range(len(keys)), "EVALSHA", script.sha)
        for attempt in ("load", "eval"):
            missing = [i for i, reply in enumerate(replies) if isinstance(reply, redis_errors.NoScriptError)]
            if not missing:
                break
            # Redis restarted or SCRIPT FLUSH: those calls did not run. Load the script
            # (on every master of a cluster) and send them again; if a flush races
            # that too, EVAL the source, which loads and runs in one step.
            if attempt == "load":
                self.client.script_load(script.script)
                redone = send(missing, "EVALSHA", script.sha)
            else:
                redone = send(missing, "EVAL", lua_source("issue"))
            for i, reply in zip(missing, redone, strict=True):
                replies[i] = reply
        _raise_first_error(replies)
        return replies

    def admit(
        self,
        client_key: str,
        limits: IssuanceLimits,
        count: int,
        ttl_seconds: int,
        token_bytes: int = 0,
        max_bytes: int | None = None,
    ) -> str:
        """Charge ``count`` tokens to a client's limits and the budget (``token_bytes`` each), or
        raise RateLimited or IssuancePaused and charge nothing.

        Returns the bucket the tokens are counted in ('' without a cap or budget) for issue.
        ``max_bytes``: the budget's byte limit for this call (the memory reserve's).
        """
        if self._observe is not None:
            return self._observed(
                "admit",
                None,
                None,
                self._admit,
                client_key,
                limits,
                count,
                ttl_seconds,
                token_bytes,
                max_bytes,
            )
        return self._admit(client_key, limits, count, ttl_seconds, token_bytes, max_bytes)

    def _admit(
        self,
        client_key: str,
        limits: IssuanceLimits,
        count: int,
        ttl_seconds: int,
        token_bytes: int = 0,
        max_bytes: int | None = None,
    ) -> str:
        limits.check_count(count)
        args = limits.args(count, ttl_seconds, self._limiter_now(), token_bytes, max_bytes)
        keys = [client_key, self._budget_key] if len(args) > 6 else [client_key]
        with translate_errors():
            reply = self._call("admit", keys, args)
        return admit_reply(reply)

    def admit_and_issue(
        self,
        client_key: str,
        limits: IssuanceLimits,
        request: IssueRequest,
        count: int = 1,
        max_bytes: int | None = None,
    ) -> list[str]:
        """``admit`` then ``issue``, in one script run (one round trip) where the keys allow it.

        The same checks and effects as the two calls: a refusal writes nothing
        and issues nothing. On Cluster it is the two calls (observed as this one).
        ``max_bytes``: the budget's byte limit for this call (the memory reserve's).
        """
        if self._observe is not None:
            return self._observed(
                ADMIT_ISSUE,
                request.scope,
                None,
                self._admit_and_issue,
                client_key,
                limits,
                request,
                count,
                max_bytes,
            )
        return self._admit_and_issue(client_key, limits, request, count, max_bytes)

    def _admit_and_issue(
        self,
        client_key: str,
        limits: IssuanceLimits,
        request: IssueRequest,
        count: int,
        max_bytes: int | None,
    ) -> list[str]:
        charge = (
            token_bytes(self.key_prefix, request.scope, request.subject, request.fingerprint)
            if limits.budget.kept
            else 0
        )
        if self._cluster:
            bucket = self._admit(client_key, limits, count, request.ttl_seconds, charge, max_bytes)
            return self._issue(request, count, client_key, bucket)
        limits.check_count(count)
        tokens, keys = new_tokens(
            count, client_tag(client_key) if limits.counts_outstanding else "", self.key_prefix
        )
        keys.append(client_key)
        keys.append(self._budget_key)
        args = [
            *request.args(),
            *limits.args(count, request.ttl_seconds, self._limiter_now(), charge, max_bytes),
        ]
        with translate_errors():
            reply = self._call(ADMIT_ISSUE, keys, args)
        if records.text(reply[0]) not in ("issued", "collision"):
            admit_reply(reply)  # raises: refused, or a rejected argument
        issued = _keep(tokens, _collisions(reply))
        if len(issued) < count:
            # a digest collision (never seen in practice): the tokens are charged, draw the rest
            # (uncounted: they stop counting when their bucket ends)
            issued += self._issue(request, count - len(issued))
        return issued

    def memory_reading(self) -> MemoryReading | None:
        """(used_memory, maxmemory) of each Redis that holds tokens, and the bytes the anonymous
        budget counts (for the issuance reserve, limits.MemoryReserve); None when Redis refuses
        ``INFO`` (renamed, or denied by an ACL). One round trip; on Cluster, one per primary."""
        with translate_errors():
            try:
                if self._cluster:
                    client: Any = self.client
                    infos = client.info("memory", target_nodes=client.PRIMARIES)
                    # a reply per primary, by node name (one primary: its reply alone)
                    nodes = [infos] if "used_memory" in infos else list(infos.values())
                    counted = client.get(self._budget_key)
                else:
                    pipe = self.client.pipeline(transaction=False)
                    pipe.info("memory")
                    pipe.get(self._budget_key)
                    info, counted = pipe.execute()
                    nodes = [info]
            except redis_errors.ResponseError as exc:
                if _unavailable(exc) is not None:
                    raise
                return None
        return [_memory(info) for info in nodes], parse_budget_record(counted)[1]

    def consume(self, use: UseRequest) -> records.Consumed:
        args = records.consume_args(use, self._now())
        if self._observe is not None:
            return self._observed_run("consume", use.token, args, records.consume_reply, use.scope)
        return self._run("consume", use.token, args, records.consume_reply)

    def begin(
        self,
        use: UseRequest,
        lease_seconds: int = defaults.DEFAULT_LEASE_SECONDS,
        claim_ttl_seconds: int | None = None,
    ) -> records.Started | records.Finished:
        """Take the token's lease (or give back the live one to a retry with the same request id,
        or the stored result once it SUCCEEDED).

        ``claim_ttl_seconds``: a keyed operation, which no token was issued for: an absent
        record is claimed, ISSUED for that long and bound to the request's scope and
        fingerprint (``use.token`` is the operation's name; it has no subject).
        """
        if claim_ttl_seconds is not None and self._plain_claim:
            if self._observe is not None:
                digest = token_digest(use.token)
                return self._observed(
                    "begin", use.scope, digest, self._claim, use, lease_seconds, claim_ttl_seconds, digest
                )
            return self._claim(use, lease_seconds, claim_ttl_seconds)
        args = records.begin_args(use, lease_seconds, new_lease_id(), self._now(), claim_ttl_seconds)
        if self._observe is not None:
            return self._observed_run("begin", use.token, args, _begin_reader(args), use.scope)
        return self._run("begin", use.token, args, _begin_reader(args))

    def _claim(
        self, use: UseRequest, lease_seconds: int, claim_ttl_seconds: int, digest: str | None = None
    ) -> records.Started | records.Finished:
        """A keyed begin: one ``SET key <PROCESSING> NX GET PX lease`` (redis-py's Lock shape: the
        lease is the key's own expiry), the usual first claim and the usual replay; what the
        record it found does not decide alone goes to begin.lua (a compare-and-change)."""
        command, lease_id, request_id = self._claim_command(use, lease_seconds, digest)
        value = command[2]
        try:
            # get=True: redis-py's parser of SET's reply gives the value found only when told
            previous = self._execute(command, get=True)
        except Exception as exc:
            self._claim_failed(exc)  # returns on Redis < 7.0 only
            return self.begin(use, lease_seconds, claim_ttl_seconds)
        decided = self._claim_decided(
            previous, use, lease_id, lease_seconds, value, request_id, claim_ttl_seconds
        )
        if isinstance(decided, list):
            return self._run("begin", use.token, decided, _begin_reader(decided), digest)
        return decided

    renew = _operation("renew", _StoreBase._renew_args, records.renew_reply)
    complete = _operation("complete", _StoreBase._complete_args, records.complete_reply)
    fail = _operation("fail", _StoreBase._fail_args, records.fail_reply)
    inspect = _operation("inspect", _StoreBase._inspect_args, records.inspect_reply)
    revoke = _operation("revoke", _StoreBase._revoke_args, records.revoke_reply)

    def ready(self) -> None:
        """Raise ServiceUnavailable unless Redis answers, takes a write, and every script is loaded.

        Missing scripts (Redis restarted, SCRIPT FLUSH) are loaded again here, so a
        readiness probe also warms the cache instead of waiting for a NOSCRIPT. The
        write (one small key that expires on its own) is refused whenever Redis
        refuses the service's writes: maxmemory with noeviction (OOM), a failed RDB
        save (MISCONF), a replica (READONLY), too few replicas (NOREPLICAS). On
        Cluster it tests the master that owns the probe's slot. On one server it
        also reads two keys of different slots in one command, which a cluster
        node reached by a ``redis://`` URL refuses (CROSSSLOT, MOVED) as it would
        refuse the scripts that take a record and its client's limit record.
        """
        probe = f"{self.key_prefix}readyz"
        with translate_errors():
            shas = [script.sha for script in self._scripts.values()]
            loaded = self.client.script_exists(*shas)
            for script, present in zip(self._scripts.values(), loaded, strict=True):
                if not present:
                    self.client.script_load(script.script)
            if self._cluster:
                self.client.set(probe, "1", px=READY_PROBE_MS)
                return
            pipe = self.client.pipeline(transaction=False)
            pipe.set(probe, "1", px=READY_PROBE_MS)
            pipe.exists(probe, _other_slot(probe))
            _raise_first_error(pipe.execute(raise_on_error=False))


class AsyncTokenStore(_StoreBase):
    """The same operations on a ``redis.asyncio`` client."""

    def __init__(self, client: redis.asyncio.Redis, **options: Any) -> None:
        super().__init__(**options)
        self.client = client
        self._cluster = isinstance(client, redis.asyncio.cluster.RedisCluster)
        self._scripts = {name: client.register_script(lua_source(name)) for name in SCRIPT_NAMES}

    async def _call(self, name: str, keys: Sequence[str], args: Sequence[str]) -> Any:
        try:
            return await self._scripts[name](keys=keys, args=list(args))
        except redis_errors.NoScriptError:
            return await self.client.eval(lua_source(name), len(keys), *keys, *args)

    async def _run(
        self, name: str, token: str, args: Sequence[str], read: Callable[[Any], T], digest: str | None = None
    ) -> T:
        with translate_errors():
            reply = await self._call(name, self._keys(name, token, digest), args)
        if self._cluster:
            await self._release(name, token, reply)
        return read(reply)

    def _observed_run(
        self, name: str, token: str, args: Sequence[str], read: Callable[[Any], T], scope: str | None = None
    ) -> Awaitable[T]:
        """As TokenStore._observed_run."""
        digest = token_digest(token)
        return self._observed(name, scope, digest, self._run, name, token, args, read, digest)

    async def _observed(
        self,
        name: str,
        scope: str | None,
        digest: str | None,
        run: Callable[P, Awaitable[T]],
        *args: P.args,
        **kw: P.kwargs,
    ) -> T:
        """As TokenStore._observed, for coroutines."""
        observe = self._observe
        assert observe is not None  # the operation checked
        try:
            outcome = await run(*args, **kw)
        except BaseException as error:
            observe(name, scope, digest, error)
            raise
        observe(name, scope, digest, outcome)
        return outcome

    async def _release(self, name: str, token: str, reply: Any) -> None:
        """As TokenStore._release."""
        bucket = _bucket(name, reply)
        client_key = client_key_of(self.key_prefix, token) if bucket else None
        if client_key is None:
            return
        try:
            await self._call("release", [client_key, self._budget_key], [bucket])
        except Exception as exc:
            if _unavailable(exc) is None:
                raise
            log.warning("a token's outstanding-cap slot was not released (Redis unavailable)")

    async def issue(self, request: IssueRequest, count: int = 1) -> list[str]:
        if self._observe is not None:
            return await self._observed("issue", request.scope, None, self._issue, request, count)
        return await self._issue(request, count)

    async def _issue(self, request: IssueRequest, count: int) -> list[str]:
        issued: list[str] = []
        args = request.args()
        while len(issued) < count:
            tokens, keys = new_tokens(count - len(issued), "", self.key_prefix)
            with translate_errors():
                if len(tokens) == 1 or not self._cluster:
                    collided = _collisions(await self._call("issue", keys, args))
                else:
                    collided = _collisions_each(await self._issue_pipelined(keys, args))
            issued += _keep(tokens, collided)
        return issued

    async def _issue_pipelined(self, keys: list[str], args: Sequence[str]) -> list[Any]:
        script = self._scripts["issue"]

        async def send(indexes: Sequence[int], command: str, body: str) -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for i in indexes:
                pipe.execute_command(command, body, "1", keys[i], *args)
            return list(await pipe.execute(raise_on_error=False))

        replies = await send(range(len(keys)), "EVALSHA", script.sha)
        for attempt in ("load", "eval"):
            missing = [i for i, reply in enumerate(replies) if isinstance(reply, redis_errors.NoScriptError)]
            if not missing:
                break
            if attempt == "load":
                await self.client.script_load(script.script)
                redone = await send(missing, "EVALSHA", script.sha)
            else:
                redone = await send(missing, "EVAL", lua_source("issue"))
            for i, reply in zip(missing, redone, strict=True):
                replies[i] = reply
        _raise_first_error(replies)
        return replies

    async def consume(self, use: UseRequest) -> records.Consumed:
        args = records.consume_args(use, self._now())
        if self._observe is not None:
            return await self._observed_run("consume", use.token, args, records.consume_reply, use.scope)
        return await self._run("consume", use.token, args, records.consume_reply)

    async def begin(
        self,
        use: UseRequest,
        lease_seconds: int = defaults.DEFAULT_LEASE_SECONDS,
        claim_ttl_seconds: int | None = None,
    ) -> records.Started | records.Finished:
        if claim_ttl_seconds is not None and self._plain_claim:
            if self._observe is not None:
                digest = token_digest(use.token)
                return await self._observed(
                    "begin", use.scope, digest, self._claim, use, lease_seconds, claim_ttl_seconds, digest
                )
            return await self._claim(use, lease_seconds, claim_ttl_seconds)
        args = records.begin_args(use, lease_seconds, new_lease_id(), self._now(), claim_ttl_seconds)
        if self._observe is not None:
            return await self._observed_run("begin", use.token, args, _begin_reader(args), use.scope)
        return await self._run("begin", use.token, args, _begin_reader(args))

    async def _claim(
        self, use: UseRequest, lease_seconds: int, claim_ttl_seconds: int, digest: str | None = None
    ) -> records.Started | records.Finished:
        """As TokenStore._claim."""
        command, lease_id, request_id = self._claim_command(use, lease_seconds, digest)
        value = command[2]
        try:
            previous = await self.client.execute_command(*command, get=True)  # type: ignore[no-untyped-call]
        except Exception as exc:
            self._claim_failed(exc)
            return await self.begin(use, lease_seconds, claim_ttl_seconds)
        decided = self._claim_decided(
            previous, use, lease_id, lease_seconds, value, request_id, claim_ttl_seconds
        )
        if isinstance(decided, list):
            return await self._run("begin", use.token, decided, _begin_reader(decided), digest)
        return decided

    renew = _async_operation("renew", _StoreBase._renew_args, records.renew_reply)
    complete = _async_operation("complete", _StoreBase._complete_args, records.complete_reply)
    fail = _async_operation("fail", _StoreBase._fail_args, records.fail_reply)
    inspect = _async_operation("inspect", _StoreBase._inspect_args, records.inspect_reply)
    revoke = _async_operation("revoke", _StoreBase._revoke_args, records.revoke_reply)
