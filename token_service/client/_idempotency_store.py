"""Redis access for the ``Idempotency-Key`` middlewares: a keyed operation's record, per client key.

The record is the common one (``lua/_record.lua``), as ``@idempotent``'s: the request's fingerprint
its binding, each attempt's random owner id its lease id (every script fenced by it), the stored
response (:meth:`StoredResponse.encode`) its opaque payload. A first request costs two round trips,
a replay one (tests/perf/test_idempotency_round_trips.py): a plain ``SET key <PROCESSING> NX GET PX
lock_ms`` whose found record :func:`decided` reads (``begin.lua`` decides what it cannot: another
attempt's claim, or this one's own after a lost reply), then ``complete.lua``; ``renew.lua`` holds
the claim meanwhile, ``fail.lua`` (remembered 0 ms) frees it. The record key is a digest of (client
identity, key): neither is stored. Records of before 0.2.0 are read until they expire, never
written (docs/deployment.md, "Upgrading").
"""

from __future__ import annotations

import base64
import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis import exceptions as redis_errors

from token_service import defaults, records, store_errors
from token_service.client._engine import Flow, drive
from token_service.client._stored_response import StoredResponse
from token_service.errors import InvalidRequest
from token_service.records import HEADED, UseRequest, read_record
from token_service.scripts import lua_source
from token_service.store import translate_errors

__all__ = [
    "AsyncIdempotencyStore",
    "Claimed",
    "IdempotencyStore",
    "InProgress",
    "Mismatch",
    "Outcome",
    "digest",
    "read_earlier",
]

# the common scripts an Idempotency-Key's record goes through (the claim itself is a plain SET)
SCRIPT_NAMES = ("begin", "renew", "complete", "fail")
_SEP = "\x1f"
_HEADED = HEADED.encode()


@dataclass(frozen=True, slots=True)
class Claimed:
    """This request holds the key: run it, then store or release."""


@dataclass(frozen=True, slots=True)
class InProgress:
    retry_after_seconds: int


@dataclass(frozen=True, slots=True)
class Mismatch:
    """The key was used for a request with a different fingerprint."""


Outcome = Claimed | StoredResponse | InProgress | Mismatch
# the fingerprint versions before the shared one computed (the core's, computed when asked)
Legacy = Callable[[], str | None]


def _no_legacy() -> None:
    return None  # a chosen fingerprint: no earlier version computed it otherwise


def digest(*parts: str) -> str:
    raw = hashlib.sha256(_SEP.join(parts).encode("utf-8", "surrogateescape")).digest()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


# -- the codec: what is sent, and what a reply means (no I/O) -------------------------------------


def _claim_value(fingerprint: str, owner: str) -> str:
    # no scope, no subject: the record key already names the client and its key
    return records.claim_value(UseRequest("", "", None, fingerprint), owner, owner)


def store_args(fingerprint: str, owner: str, response: StoredResponse, ttl_seconds: int) -> list[Any]:
    """complete.lua's ARGV: the response is the payload as it is (bytes), never parsed. Its head
    and body go apart (ARGV[7] is appended there): a large body is never copied again to join it."""
    head = response.encode_head()
    claimed = _claim_value(fingerprint, owner)
    # ARGV[5], ARGV[6]: the script's fast path, the claim as written and what replaces it
    succeeded = f"S{claimed[1:]}{_SEP}{head.decode('ascii')}"
    return [owner, head, str(ttl_seconds * 1000), "", claimed, succeeded, response.body]


def _not_a_record() -> InvalidRequest:
    return InvalidRequest("Rejected by the store: the key holds something that is not an idempotency record.")


def decided(previous: Any, fingerprint: str, legacy: Legacy) -> Outcome | None:
    """What the claim's reply decides alone: claimed (nothing was there), the stored response,
    a mismatch; None: ``begin.lua`` decides (another attempt's claim, or this one's own).

    ``legacy`` gives the fingerprint versions before the shared one computed, looked at only
    for a record of the format before 0.2.0 that does not match ``fingerprint``.
    """
    if previous is None:
        return Claimed()
    raw = previous if isinstance(previous, bytes) else str(previous).encode("utf-8", "surrogateescape")
    letter, headed = raw[:1], raw[1:2] == _HEADED
    if not headed:
        return _earlier_format(raw, fingerprint, legacy)
    if letter not in (b"P", b"S"):
        raise _not_a_record()
    found = read_record(raw.decode("utf-8", "surrogateescape"))
    if found.fingerprint != fingerprint:
        return Mismatch()
    if letter == b"P":
        return None
    return StoredResponse.decode(found.payload.encode("utf-8", "surrogateescape"))


def read_earlier(raw: bytes) -> tuple[str, str, bytes] | None:
    """A record the middlewares wrote before 0.2.0, or None: its letter (``P`` while its request
    ran, ``D`` once stored), its fingerprint and the rest (the owner id, the stored response)."""
    letter = raw[:1]
    found, separator, rest = raw[1:].partition(b"\x1f")
    if letter not in (b"P", b"D") or not separator or raw[1:2] == _HEADED:
        return None
    return letter.decode(), found.decode("ascii", "replace"), rest


def _earlier_format(raw: bytes, fingerprint: str, legacy: Legacy) -> Outcome:
    """A record of the format before 0.2.0 (:func:`read_earlier`), read until it expires."""
    earlier = read_earlier(raw)
    if earlier is None:
        raise _not_a_record()
    letter, found, response = earlier
    if found not in (fingerprint, legacy()):
        return Mismatch()
    if letter == "P":
        return InProgress(retry_after_seconds=1)  # its holder (an instance not yet upgraded) finishes it
    return StoredResponse.decode(response)


def begun(reply: records.Reply) -> Outcome:
    """``begin.lua``'s answer (the rare path of the claim)."""
    code = records.text(reply[0])
    if code == "started":
        return Claimed()  # a fresh claim, or this attempt's own whose reply was lost
    if code == "succeeded":
        return StoredResponse.decode(reply[1])
    if code == "token_in_progress":
        return InProgress(retry_after_seconds=max(1, -(-int(reply[1]) // 1000)))
    if code == "token_mismatch":
        return Mismatch()
    records.raise_for(reply)  # invalid_argument
    raise _not_a_record()


def held(reply: records.Reply | int) -> bool:
    """Whether renew/complete/fail found this attempt's claim (False: it ran out or is another's)."""
    if reply == 0:
        return True  # complete.lua's usual answer: stored
    assert isinstance(reply, list)
    code = records.text(reply[0])
    if code == "invalid_argument":
        records.raise_for(reply)
    return code in ("renewed", "succeeded", "released")


class _Store:
    """What both stores are: the record key and each call as a flow (:mod:`._engine`'s shape, one
    for both drivers: the core drives an async store's with ``drive_async``)."""

    def __init__(self, client: Any, key_prefix: str = defaults.KEY_PREFIX) -> None:
        self.client = client
        self.key_prefix = key_prefix
        self._scripts = {name: client.register_script(lua_source(name)) for name in SCRIPT_NAMES}
        self._plain_claim = True  # until a Redis older than 7.0 refuses it

    def key(self, identity: str, idempotency_key: str) -> str:
        # 128 bits of the digest, like token record keys
        return f"{self.key_prefix}ik:{digest(identity, idempotency_key)[:22]}"

    def _script(self, name: str, key: str, args: list[Any]) -> Flow[Any]:
        with translate_errors():  # the driver throws a call's error in here
            return (yield functools.partial(self._scripts[name], keys=[key], args=args))

    def beginning(
        self, key: str, fingerprint: str, owner: str, lock_seconds: int, legacy: Legacy = _no_legacy
    ) -> Flow[Outcome]:
        if self._plain_claim:
            claim = ("SET", key, _claim_value(fingerprint, owner), "NX", "GET", "PX", lock_seconds * 1000)
            try:
                previous = yield functools.partial(self.client.execute_command, *claim, get=True)
            except Exception as exc:
                self._refused(exc)
            else:
                outcome = decided(previous, fingerprint, legacy)
                if outcome is not None:
                    return outcome
        args = records.begin_args(
            UseRequest("", "", None, fingerprint, owner), lock_seconds, owner, "", lock_seconds
        )
        return begun((yield from self._script("begin", key, args)))

    def renewing(self, key: str, owner: str, lock_seconds: int) -> Flow[bool]:
        """Hold the claim ``lock_seconds`` more from now; False when this attempt no longer held it."""
        return held((yield from self._script("renew", key, records.renew_args(owner, lock_seconds, ""))))

    def storing(
        self, key: str, fingerprint: str, owner: str, response: StoredResponse, ttl_seconds: int
    ) -> Flow[bool]:
        """Keep ``response`` for duplicates; False when this attempt no longer held the key."""
        args = store_args(fingerprint, owner, response, ttl_seconds)
        return held((yield from self._script("complete", key, args)))

    def releasing(self, key: str, owner: str) -> Flow[bool]:
        """Free the key for a retry; False when this attempt no longer held it."""
        return held((yield from self._script("fail", key, records.fail_args(owner, True, None, 0, ""))))

    def _refused(self, exc: Exception) -> None:
        """Redis 6.2 refuses SET with both NX and GET (a syntax error): from then on begin.lua
        claims. Any other error is raised, as :func:`translate_errors` translates it."""
        if not (isinstance(exc, redis_errors.ResponseError) and "syntax" in str(exc).lower()):
            unavailable = store_errors.unavailable(exc)
            if unavailable is None:
                raise exc
            raise unavailable from exc
        self._plain_claim = False


class IdempotencyStore(_Store):
    """An Idempotency-Key's record on a (sync) redis-py client (see the module docs)."""

    def begin(
        self, key: str, fingerprint: str, owner: str, lock_seconds: int, legacy: Legacy = _no_legacy
    ) -> Outcome:
        return drive(self.beginning(key, fingerprint, owner, lock_seconds, legacy))

    def renew(self, key: str, owner: str, lock_seconds: int) -> bool:
        return drive(self.renewing(key, owner, lock_seconds))

    def store(
        self, key: str, fingerprint: str, owner: str, response: StoredResponse, ttl_seconds: int
    ) -> bool:
        return drive(self.storing(key, fingerprint, owner, response, ttl_seconds))

    def release(self, key: str, owner: str) -> bool:
        return drive(self.releasing(key, owner))


class AsyncIdempotencyStore(_Store):
    """The same on a ``redis.asyncio`` client (the ASGI middleware's): its flows driven awaiting."""
