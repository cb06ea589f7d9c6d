"""Redis access for the ``Idempotency-Key`` middleware: three Lua scripts, one key per client key.

The sibling of :mod:`token_service.store` (same script loading, same error
translation at the edge). A key's record is claimed by the first request
(``idempotency_begin``), then either holds that request's response
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
import json
from dataclasses import dataclass
from typing import Any

from token_service import records
from token_service.errors import InvalidRequest
from token_service.store import lua_source, translate_errors

SCRIPT_NAMES = ("idempotency_begin", "idempotency_store", "idempotency_release")
_SEP = "\x1f"


@dataclass(frozen=True, slots=True)
class StoredResponse:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def encode(self) -> bytes:
        """Compact: a one-line JSON head, a newline, then the body's raw bytes."""
        head = json.dumps({"s": self.status, "h": self.headers}, separators=(",", ":"), ensure_ascii=True)
        return head.encode("ascii") + b"\n" + self.body

    @classmethod
    def decode(cls, raw: bytes) -> StoredResponse:
        head, _, body = raw.partition(b"\n")
        parsed = json.loads(head)
        return cls(parsed["s"], [(name, value) for name, value in parsed["h"]], body)


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


def request_fingerprint(method: str, path: str, query: str, body: bytes) -> str:
    """What makes two requests "the same": method, path, query string and body bytes."""
    hasher = hashlib.sha256()
    for part in (method.upper().encode(), path.encode("latin-1"), query.encode("latin-1")):
        hasher.update(part + b"\n")
    hasher.update(body)
    return base64.urlsafe_b64encode(hasher.digest()).rstrip(b"=").decode("ascii")


class IdempotencyStore:
    """The three idempotency scripts on a (sync) redis-py client."""

    def __init__(self, client: Any, *, key_prefix: str = "ts:") -> None:
        self.client = client
        self.key_prefix = key_prefix
        self._scripts = {name: client.register_script(lua_source(name)) for name in SCRIPT_NAMES}

    def key(self, identity: str, idempotency_key: str) -> str:
        # 128 bits of the digest, like token record keys
        return f"{self.key_prefix}ik:{digest(identity, idempotency_key)[:22]}"

    def _run(self, name: str, key: str, args: list[Any]) -> list[Any]:
        with translate_errors():
            reply: list[Any] = self._scripts[name](keys=[key], args=args)
        if records.text(reply[0]) == "invalid_argument":
            raise InvalidRequest(f"Rejected by the store: {records.text(reply[1])}.")
        return reply

    def begin(
        self, key: str, fingerprint: str, owner: str, lock_seconds: int
    ) -> Claimed | StoredResponse | InProgress | Mismatch:
        reply = self._run("idempotency_begin", key, [fingerprint, owner, str(lock_seconds * 1000)])
        outcome = records.text(reply[0])
        if outcome == "started":
            return Claimed()
        if outcome == "replay":
            return StoredResponse.decode(reply[1])
        if outcome == "in_progress":
            return InProgress(retry_after_seconds=max(1, -(-int(reply[1]) // 1000)))
        return Mismatch()

    def store(
        self, key: str, fingerprint: str, owner: str, response: StoredResponse, ttl_seconds: int
    ) -> bool:
        """Keep ``response`` for duplicates; False when this attempt no longer held the key."""
        args = [fingerprint, owner, response.encode(), str(ttl_seconds * 1000)]
        return records.text(self._run("idempotency_store", key, args)[0]) == "stored"

    def release(self, key: str, fingerprint: str, owner: str) -> bool:
        """Free the key for a retry; False when this attempt no longer held it."""
        return records.text(self._run("idempotency_release", key, [fingerprint, owner])[0]) == "released"
