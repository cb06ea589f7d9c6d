"""Any function, keyed by any value: run it at most once per key, no token issued beforehand.

::

    @idempotent(client, "order.ship", key="order_id")
    def ship(order_id: str, address: dict) -> dict:
        ...

    ship("o-1", address)   # runs, stores its (JSON) result
    ship("o-1", address)   # does not run: returns the stored result

The key is any JSON value taken from the call: an argument's name
(``key="message_id"``), several names (``key=("user_id", "cart_id")``) or a
callable given the function's arguments. The block form is
:func:`keyed_guard`; coroutine functions take an :class:`AsyncTokenClient`.

It is the two-phase guard (:class:`~token_service.client.guard.Guard`) on a
record derived from ``(scope, key)`` instead of an issued token: ``begin``
claims an absent record with one plain ``SET NX GET PX`` (the lease is the key's
own expiry; ``lua/begin.lua``'s ``claim_ms`` decides the rare cases), and
everything after is the token state machine — a lease while the function runs
(taken over when its holder dies), release on an exception (retryable),
terminal failures recorded (``terminal=``: duplicates get
:class:`~token_service.errors.TokenFailed`), the result replayed to every
duplicate, ``wait_seconds`` to wait for a live holder and return its result.

The derived record can never be reached with a token: its name (``op:`` and a
digest) is not a well-formed token, which every token path (the HTTP API, the
direct transport, ``@require_token``) refuses before Redis. It runs on the
direct transport (``TokenClient.from_redis``): the service's HTTP API takes
issued tokens only.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, Unpack

from . import _validate as check
from ._client import AsyncTokenClient, KeyedCalls, TokenClient, keyed_calls
from ._fingerprint import canonical_json, fingerprint
from ._typed_results import return_type
from .guard import AsyncGuard, Guard, GuardHookArgs, GuardHooks, Terminal, as_json, hooks_of

__all__ = ["idempotent", "keyed_guard", "operation_token"]

# the name it had as client/functions.py, so logging configs that name it still reach it
log = logging.getLogger("token_service.client.functions")

T = TypeVar("T")
# How long a key is remembered while nothing finished it (a finished one is kept at least
# the store's result_ttl_seconds): the longest a released or abandoned key blocks nothing.
DEFAULT_KEY_TTL_SECONDS = 86400
KeySpec = str | Sequence[str] | Callable[..., Any]


def operation_token(scope: str, key: Any) -> str:
    """The name of the record of ``key`` in ``scope``: ``op:`` and a SHA-256 of both (never a token).

    The key itself never reaches Redis, only this digest of it.
    """
    check.scope(scope)
    if key is None:
        raise ValueError("the idempotency key is None (a missing message id?): refusing to key on it")
    try:
        # a str key (the usual order or message id) is its own JSON form: no round trip
        canonical = canonical_json([scope, key] if type(key) is str else as_json([scope, key]))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"an idempotency key must be a JSON value (str, int, tuple, ...): {exc}") from exc
    digest = hashlib.sha256(canonical).digest()
    return "op:" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _fingerprint(value: Any) -> str | None:
    """The record's fingerprint for a JSON value describing the input: its SHA-256 (hex)."""
    if value is None:
        return None
    try:
        return fingerprint(as_json(value))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"a fingerprint must be made of JSON values: {exc}") from exc


def _guard_for(keyed: KeyedCalls, scope: str, key: Any, fingerprint: Any, options: dict[str, Any]) -> Any:
    """The guard of ``key`` in ``scope``; ``options`` are the guard's (made once per decorator)."""
    guard = (AsyncGuard if keyed.is_async else Guard)(
        keyed,  # sync or async as its client is
        operation_token(scope, key),
        scope,
        fingerprint=_fingerprint(fingerprint),
        **options,
    )
    guard.key = key  # what OutcomeNotRecorded names, for whoever reconciles it
    return guard


def keyed_guard(
    client: TokenClient | AsyncTokenClient,
    scope: str,
    key: Any,
    *,
    fingerprint: Any = None,
    ttl_seconds: int = DEFAULT_KEY_TTL_SECONDS,
    request_id: str | None = None,
    lease_seconds: int | None = None,
    terminal: Terminal = (),
    wait_seconds: float = 0.0,
    renew: bool = True,
    hooks: GuardHooks | None = None,
    **hook_args: Unpack[GuardHookArgs],
) -> Any:
    """A guard on ``key`` in ``scope``: ``with`` it (``async with`` for an AsyncTokenClient).

    ::

        try:
            with keyed_guard(client, "invoice.send", invoice_id) as op:
                op.result = send(invoice_id)
            sent = op.result
        except Replayed as replay:
            sent = replay.result

    ``fingerprint`` is any JSON value describing the operation's input (kept as
    its SHA-256): the same key with another fingerprint raises
    :class:`~token_service.errors.TokenMismatch` instead of replaying a result
    that answers another question. ``ttl_seconds`` is how long an unfinished key
    is remembered (a finished one: at least the store's ``result_ttl_seconds``).
    ``renew=False`` skips the background lease renewal (work that always ends well
    within ``lease_seconds``). The guard's hooks: ``hooks=GuardHooks(...)``, or
    ``on_replay``, ``on_conflict``, ``on_mismatch`` and ``on_lease_lost`` by name.
    """
    options = {
        "request_id": request_id,
        "lease_seconds": lease_seconds,
        "terminal": terminal,
        "wait_seconds": wait_seconds,
        "renew": renew,
        "hooks": hooks_of(hooks, hook_args),
    }
    return _guard_for(keyed_calls(client, ttl_seconds), scope, key, fingerprint, options)


def _key_reader(
    operation: Callable[..., Any], key: KeySpec, what: str
) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    """How to read the key (or fingerprint) of a call: argument name(s) or a callable."""
    if callable(key):
        return lambda args, kwargs: key(*args, **kwargs)
    signature = inspect.signature(operation)
    names = (key,) if isinstance(key, str) else tuple(key)
    if not names:
        raise TypeError(f"{what} names no argument")
    for name in names:
        if name not in signature.parameters:
            raise TypeError(f"{operation.__qualname__} has no parameter {name!r} to take the {what} from")

    def read(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # partial: a durable function's ``conn`` is not the caller's to pass
        bound = signature.bind_partial(*args, **kwargs)
        bound.apply_defaults()
        values = [bound.arguments[name] for name in names]
        return values[0] if isinstance(key, str) else values

    if not isinstance(key, str):
        return read
    # One argument by name, on every call: read it where the caller put it (its position or
    # its keyword) without binding the whole signature; anything else is bound as above.
    parameters = list(signature.parameters.values())
    position = parameters.index(signature.parameters[key])
    by_position = all(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters[: position + 1]
    )
    keyword = signature.parameters[key].kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )

    positional = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters)

    def read_one(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # (too many arguments: bound below, which refuses them before anything reaches Redis)
        if by_position and position < len(args) <= positional and not kwargs:
            return args[position]
        if keyword and not args and len(kwargs) == 1 and key in kwargs:
            return kwargs[key]
        return read(args, kwargs)

    return read_one


def idempotent(
    client: TokenClient | AsyncTokenClient,
    scope: str,
    *,
    key: KeySpec,
    fingerprint: KeySpec | None = None,
    ttl_seconds: int = DEFAULT_KEY_TTL_SECONDS,
    lease_seconds: int | None = None,
    terminal: Terminal = (),
    wait_seconds: float = 0.0,
    renew: bool = True,
    durable: Any = None,
    durable_table: Any = None,
    hooks: GuardHooks | None = None,
    **hook_args: Unpack[GuardHookArgs],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a function so it runs at most once per key (see the module docs).

    ``key`` names the argument (or arguments) the key is made of, or is a
    callable given the function's arguments. ``fingerprint`` (names or a
    callable, optional) describes the input: the same key called with another
    fingerprint raises :class:`~token_service.errors.TokenMismatch`. The
    decorated function returns the result read back as its return annotation
    (a dataclass, a pydantic model, ``tuple[...]``; without one, its JSON form:
    tuples become lists), the same value every duplicate gets. Raises
    :class:`~token_service.errors.TokenInProgress` while another call holds
    the key (after ``wait_seconds``), :class:`~token_service.errors.TokenFailed`
    after a terminal failure.

    ``durable`` (a SQLAlchemy ``Engine``, ``pip install 'idempotency-token-service[db]'``)
    also records the key in the durable backstop (:mod:`token_service.client.durable`):
    the function is called with ``conn=``, a connection inside a transaction
    that also inserts the key's record, so its own writes and the record commit
    together or not at all. Should Redis ever forget the key (a failover that
    lost the write), the record refuses the second execution and its stored
    result is returned. ``durable_table`` is the records table (default
    ``idempotency_records``).

    ``hooks=GuardHooks(...)`` are the guard's hooks (see the SDK docs), or by name:
    ``on_replay(guard)``, ``on_conflict(guard, error)``, ``on_mismatch(guard, error)``
    and ``on_lease_lost(guard, error)``; built into one value once, at decoration.
    """
    check.scope(scope)
    keyed = keyed_calls(client, ttl_seconds)
    hooks = hooks_of(hooks, hook_args)  # once: every call's guard gets this one value

    def decorate(operation: Callable[..., Any]) -> Callable[..., Any]:
        read_key = _key_reader(operation, key, "key")
        read_fingerprint = _key_reader(operation, fingerprint, "fingerprint") if fingerprint else None
        is_async = inspect.iscoroutinefunction(operation)
        options = {  # once, not per call: results are read back as its return type
            "lease_seconds": lease_seconds,
            "terminal": terminal,
            "wait_seconds": wait_seconds,
            "renew": renew,
            "result_type": return_type(operation),
            "hooks": hooks,
        }
        if is_async != keyed.is_async:
            raise TypeError("coroutine functions need an AsyncTokenClient, plain functions a TokenClient")
        if durable is not None:
            if is_async:
                raise TypeError("durable= records run in a sync transaction: not for coroutine functions")
            if "conn" not in inspect.signature(operation).parameters:
                raise TypeError(f"{operation.__qualname__} takes durable= records: give it a conn parameter")

        def guard_for(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            described = read_fingerprint(args, kwargs) if read_fingerprint else None
            key_value = read_key(args, kwargs)
            return _guard_for(keyed, scope, key_value, described, options)

        if is_async:

            @functools.wraps(operation)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                return await guard_for(args, kwargs).run(operation, *args, **kwargs)

            return run_async

        @functools.wraps(operation)
        def run(*args: Any, **kwargs: Any) -> Any:
            guard = guard_for(args, kwargs)
            if durable is None:
                return guard.run(operation, *args, **kwargs)
            return guard.run(_recorded, durable, durable_table, guard.token, operation, args, kwargs)

        return run

    return decorate


def _recorded(
    engine: Any,
    table: Any,
    name: str,
    operation: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """Run ``operation`` in a transaction that also claims the key's durable record (or replay it)."""
    from token_service.client.durable import retry_transaction, run_once
    from token_service.client.durable._schema import IDEMPOTENCY_RECORDS

    from ._stored_response import StoredResponse
    from ._typed_results import dump_result

    record_key = name  # "op:" and the key's digest: never a token's record key ("token:...")

    def handler(conn: Any) -> StoredResponse:
        return StoredResponse.json(200, as_json(dump_result(operation(*args, conn=conn, **kwargs))))

    def work(conn: Any) -> Any:
        outcome = run_once(conn, record_key, handler, table=IDEMPOTENCY_RECORDS if table is None else table)
        if outcome.replayed:
            log.warning("a keyed operation Redis had no record of was found done in the database")
        return outcome.response.payload()

    return retry_transaction(engine, work)
