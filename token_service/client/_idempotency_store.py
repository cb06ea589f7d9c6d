"""Redis access for the ``Idempotency-Key`` middlewares: four Lua scripts, one key per client key.

The sibling of :mod:`token_service.store` (same script loading, same error
translation at the edge). A key's record is claimed by the first request
(``idempotency_begin``), kept claimed while the request runs
(``idempotency_renew``), then either holds that request's response
(``idempotency_store``) or is freed again (``idempotency_release``). Each
attempt claims with its own random owner id, so an attempt whose claim ran
out can neither overwrite nor free the key a later attempt holds.

The record key is a digest of (client identity, Idempotency-Key): neither
the client's credentials nor its key are stored, and two clients choosing
the same key never meet.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any

from token_service import defaults, records
from token_service.client._stored_response import StoredResponse
from token_service.errors import InvalidRequest
from token_service.scripts import lua_source
from token_service.store import translate_errors

__all__ = [
    "SCRIPT_NAMES",
    "AsyncIdempotencyStore",
    "Claimed",
    "IdempotencyStore",
    "InProgress",
    "Mismatch",
    "Outcome",
    "digest",
]

SCRIPT_NAMES = ("idempotency_begin", "idempotency_renew", "idempotency_store", "idempotency_release")
_SEP = "\x1f"


@dataclass(frozen=True, slots=True)
class Claimed:
    """This request holds the key: run it, then store or release."""


@dataclass(frozen=True, slots=True)
class InProgress:
    retry_after_seconds: int


@dataclass(frozen=True, slots=True)
class Mismatch:
    """The key was used for a request with a different fingerprint."""


def digest(*parts: str) -> str:
    raw = hashlib.sha256(_SEP.join(parts).encode("utf-8", "surrogateescape")).digest()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


Outcome = Claimed | StoredResponse | InProgress | Mismatch


def _check(reply: list[Any]) -> list[Any]:
    if records.text(reply[0]) == "invalid_argument":
        raise InvalidRequest(f"Rejected by the store: {records.text(reply[1])}.")
    return reply


def _outcome(reply: list[Any]) -> Outcome:
    outcome = records.text(reply[0])
    if outcome == "started":
        return Claimed()
    if outcome == "replay":
        return StoredResponse.decode(reply[1])
    if outcome == "in_progress":
        return InProgress(retry_after_seconds=max(1, -(-int(reply[1]) // 1000)))
    return Mismatch()


class _Scripts:
    def __init__(self, client: Any, key_prefix: str) -> None:
        self.client = client
        self.key_prefix = key_prefix
        self._scripts = {name: client.register_script(lua_source(name)) for name in SCRIPT_NAMES}

    def key(self, identity: str, idempotency_key: str) -> str:
        # 128 bits of the digest, like token record keys
        return f"{self.key_prefix}ik:{digest(identity, idempotency_key)[:22]}"


class IdempotencyStore(_Scripts):
    """The idempotency scripts on a (sync) redis-py client."""

    def __init__(self, client: Any, *, key_prefix: str = defaults.KEY_PREFIX) -> None:
        super().__init__(client, key_prefix)

    def _run(self, name: str, key: str, args: list[Any]) -> list[Any]:
        with translate_errors():
            reply: list[Any] = self._scripts[name](keys=[key], args=args)
        return _check(reply)

    def begin(self, key: str, fingerprint: str, owner: str, lock_seconds: int) -> Outcome:
        return _outcome(self._run("idempotency_begin", key, [fingerprint, owner, str(lock_seconds * 1000)]))

    def renew(self, key: str, fingerprint: str, owner: str, lock_seconds: int) -> bool:
        """Hold the claim ``lock_seconds`` more from now; False when this attempt no longer held it."""
        args = [fingerprint, owner, str(lock_seconds * 1000)]
        return records.text(self._run("idempotency_renew", key, args)[0]) == "renewed"

    def store(
        self, key: str, fingerprint: str, owner: str, response: StoredResponse, ttl_seconds: int
    ) -> bool:
        """Keep ``response`` for duplicates; False when this attempt no longer held the key."""
        args = [fingerprint, owner, response.encode_head(), response.body, str(ttl_seconds * 1000)]
        return records.text(self._run("idempotency_store", key, args)[0]) == "stored"

    def release(self, key: str, fingerprint: str, owner: str) -> bool:
        """Free the key for a retry; False when this attempt no longer held it."""
        return records.text(self._run("idempotency_release", key, [fingerprint, owner])[0]) == "released"


class AsyncIdempotencyStore(_Scripts):
    """The same scripts on a ``redis.asyncio`` client (the ASGI middleware's)."""

    def __init__(self, client: Any, *, key_prefix: str = defaults.KEY_PREFIX) -> None:
        super().__init__(client, key_prefix)

    async def _run(self, name: str, key: str, args: list[Any]) -> list[Any]:
        with translate_errors():
            reply: list[Any] = await self._scripts[name](keys=[key], args=args)
        return _check(reply)

    async def begin(self, key: str, fingerprint: str, owner: str, lock_seconds: int) -> Outcome:
        reply = await self._run("idempotency_begin", key, [fingerprint, owner, str(lock_seconds * 1000)])
        return _outcome(reply)

    async def renew(self, key: str, fingerprint: str, owner: str, lock_seconds: int) -> bool:
        args = [fingerprint, owner, str(lock_seconds * 1000)]
        return records.text((await self._run("idempotency_renew", key, args))[0]) == "renewed"

    async def store(
        self, key: str, fingerprint: str, owner: str, response: StoredResponse, ttl_seconds: int
    ) -> bool:
        args = [fingerprint, owner, response.encode_head(), response.body, str(ttl_seconds * 1000)]
        return records.text((await self._run("idempotency_store", key, args))[0]) == "stored"

    async def release(self, key: str, fingerprint: str, owner: str) -> bool:
        reply = await self._run("idempotency_release", key, [fingerprint, owner])
        return records.text(reply[0]) == "released"
