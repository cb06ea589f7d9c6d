"""Operators' tools over the store: find, show, revoke, release and list records. No Flask.

An operator never has the token (nobody keeps it), so records are found by
what the logs carry:

- the ``token_ref`` of an access line: the token's digest, which *is* the
  record key's last part (``<prefix>t:<token_ref>``): one GET. A shorter
  prefix of it (older logs kept 8 characters) is looked for with a bounded
  SCAN;
- the ``request_id`` a consume or begin carried (stored in the record): a
  bounded SCAN that reads each record;
- an ``Idempotency-Key`` and the client identity the middleware keyed it on
  (by default the ``Authorization`` header): the digest of both is the key.

Every listing walks the keyspace with ``SCAN … COUNT n`` (each call does
O(n) work, so Redis is never held for long), one node at a time on a Cluster,
and hands back a cursor to continue from. Each action writes one audit line
on the ``token_service.audit`` logger: the action, the record's reference
and the outcome, never a token, a credential or an Idempotency-Key.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, ClassVar

import redis
import redis.cluster
from redis import exceptions as redis_errors

from token_service import defaults, records
from token_service.client._idempotency_store import digest as idempotency_digest
from token_service.client._idempotency_store import read_earlier
from token_service.client._stored_response import StoredResponse
from token_service.errors import InvalidRequest, NotInProgress, RecordNotFound
from token_service.records import UseRequest, read_record
from token_service.scripts import lua_source
from token_service.store import translate_errors
from token_service.tokens import is_plain_text, new_lease_id

__all__ = [
    "BODY_PREVIEW_BYTES",
    "DEFAULT_COUNT",
    "FULL_REF_CHARS",
    "IDEMPOTENCY",
    "IDEMPOTENCY_STATES",
    "KINDS",
    "MAX_COUNT",
    "REF_RE",
    "STATES",
    "TOKEN",
    "TOKEN_STATES",
    "Admin",
    "Filter",
    "Page",
    "Record",
    "audit",
    "check_ref",
    "parse_idempotency_record",
    "parse_token_record",
    "shown_ref",
]

audit_log = logging.getLogger("token_service.audit")

TOKEN = "token"  # noqa: S105 - a record kind, not a secret
IDEMPOTENCY = "idempotency"
KINDS = (TOKEN, IDEMPOTENCY)
TOKEN_STATES = {"I": "ISSUED", "P": "PROCESSING", "C": "CONSUMED", "S": "SUCCEEDED", "F": "FAILED"}
# An Idempotency-Key's record is a keyed operation's (PROCESSING, then SUCCEEDED: shown as
# COMPLETED, its stored response); D is COMPLETED in the format before 0.2.0, read until it expires.
IDEMPOTENCY_STATES = {"P": "PROCESSING", "S": "COMPLETED", "D": "COMPLETED"}
STATES = frozenset(TOKEN_STATES.values()) | frozenset(IDEMPOTENCY_STATES.values())
# A token_ref is base64url; no glob characters can reach a SCAN MATCH pattern.
REF_RE = re.compile(r"[A-Za-z0-9_-]{6,22}\Z")
FULL_REF_CHARS = 22
DEFAULT_COUNT = 1000
MAX_COUNT = 10000
BODY_PREVIEW_BYTES = 4096
_SCRIPTS = ("admin_read", "begin", "complete", "fail", "revoke")


def check_ref(ref: str) -> str:
    if not isinstance(ref, str) or not REF_RE.match(ref):
        raise InvalidRequest(
            "A record reference is 6-22 characters of A-Za-z0-9_- (the token_ref of a log line).",
            {"ref": ["6-22 characters of A-Za-z0-9_-."]},
        )
    return ref


def _iso(epoch_ms: int) -> str:
    return (
        datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


def audit(actor: str, action: str, ref: str | None, outcome: str, **details: Any) -> None:
    """One audit line: who, which action, on which record, with what outcome (never a secret)."""
    fields = {"audit": True, "actor": actor, "action": action, "ref": ref, "outcome": outcome}
    fields.update({name: value for name, value in details.items() if value is not None})
    audit_log.info("admin %s", action, extra=fields)


def shown_ref(text: Any) -> str | None:
    """A ref fit for a log line: only one of a ref's shape (a longer string may be a token)."""
    return text if isinstance(text, str) and REF_RE.match(text) else None


@dataclass(frozen=True)
class Record:
    """One record as an operator sees it (no token, no lease id, no owner id).

    ``expires_in_ms`` is the record's own time left in Redis (None: no expiry);
    for a PROCESSING token, ``lease_expires_in_ms`` is the lease's (negative once
    it ran out: the holder is presumed dead and the token may be taken again) and
    ``token_expires_in_ms`` the token's own.
    """

    kind: str
    ref: str
    key: str
    state: str
    now_ms: int
    expires_in_ms: int | None
    scope: str | None = None
    subject: str | None = None
    fingerprint: str | None = None
    request_id: str | None = None
    lease_expires_in_ms: int | None = None
    token_expires_in_ms: int | None = None
    result: Any = None
    error: Any = None
    response: dict[str, Any] | None = None
    # not shown: what release and the reconciler need to act on the record ('' for an
    # Idempotency-Key's record of the format before 0.2.0)
    _lease_id: str = field(default="", repr=False, compare=False)

    @property
    def lease_expired(self) -> bool:
        return self.lease_expires_in_ms is not None and self.lease_expires_in_ms <= 0

    def to_dict(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"kind": self.kind, "ref": self.ref, "key": self.key, "state": self.state}
        if self.kind == TOKEN:
            shown.update(
                scope=self.scope,
                subject=self.subject,
                fingerprint=self.fingerprint,
                request_id=self.request_id,
            )
        else:
            shown["fingerprint"] = self.fingerprint
        shown["expires_in_seconds"] = None if self.expires_in_ms is None else self.expires_in_ms / 1000
        if self.expires_in_ms is not None:
            shown["expires_at"] = _iso(self.now_ms + self.expires_in_ms)
        if self.lease_expires_in_ms is not None:
            shown["lease_expires_at"] = _iso(self.now_ms + self.lease_expires_in_ms)
            shown["lease_expires_in_seconds"] = self.lease_expires_in_ms / 1000
            shown["lease_expired"] = self.lease_expired
        if self.token_expires_in_ms is not None:
            shown["token_expires_at"] = _iso(self.now_ms + self.token_expires_in_ms)
            shown["token_expires_in_seconds"] = self.token_expires_in_ms / 1000
        if self.state == "SUCCEEDED":
            shown["result"] = self.result
        if self.state == "FAILED":
            shown["error"] = self.error
        if self.response is not None:
            shown["response"] = self.response
        return shown


def _load_json(raw: str) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return raw  # shown as stored


def _common(kind: str, key: str, ref: str, letter: str, pttl: int, now: int) -> dict[str, Any]:
    """The fields of a record that either kind shows alike: the state its letter names
    (``UNKNOWN(x)`` for a letter this version does not know), its time left in Redis (a
    negative ``pttl``: none)."""
    names = TOKEN_STATES if kind == TOKEN else IDEMPOTENCY_STATES
    state, left = names.get(letter, f"UNKNOWN({letter})"), pttl if pttl >= 0 else None
    return {"kind": kind, "ref": ref, "key": key, "state": state, "now_ms": now, "expires_in_ms": left}


def parse_token_record(key: str, ref: str, value: str, pttl: int, now: int) -> Record:
    found = read_record(value)  # the one reader of the record, either layout
    state_letter = found.state
    lease_left = token_left = None
    if state_letter == "P":
        if found.lease_expires_ms is None:
            # a keyed claim: its lease is the key's own expiry, and so is its life
            lease_left = token_left = pttl
        else:
            lease_left = found.lease_expires_ms - now
            token_left = (found.token_expires_ms or 0) - now
    return Record(
        **_common(TOKEN, key, ref, state_letter, pttl, now),
        scope=found.scope,
        subject=found.subject or None,
        fingerprint=found.fingerprint or None,
        request_id=found.request_id or None,
        lease_expires_in_ms=lease_left,
        token_expires_in_ms=token_left,
        result=_load_json(found.payload) if state_letter == "S" else None,
        error=_load_json(found.payload) if state_letter == "F" else None,
        _lease_id=found.lease_id,
    )


def _response_view(raw: bytes) -> dict[str, Any]:
    try:
        stored = StoredResponse.decode(raw)
    except (ValueError, KeyError, TypeError):
        return {"unreadable": True, "bytes": len(raw)}
    body = stored.body[:BODY_PREVIEW_BYTES]
    try:
        shown_body: dict[str, Any] = {"body": body.decode("utf-8")}
    except UnicodeDecodeError:
        shown_body = {"body_base64": base64.b64encode(body).decode("ascii")}
    return {
        "status": stored.status,
        "headers": [list(pair) for pair in stored.headers],
        "body_bytes": len(stored.body),
        "body_truncated": len(stored.body) > BODY_PREVIEW_BYTES,
        **shown_body,
    }


def parse_idempotency_record(key: str, ref: str, value: bytes, pttl: int, now: int) -> Record:
    earlier = read_earlier(value)
    if earlier is not None:
        letter, fingerprint, rest = earlier
        lease_id = ""
    else:
        found = read_record(value.decode("utf-8", "surrogateescape"))  # the one reader of the record
        letter, fingerprint, lease_id = found.state, found.fingerprint, found.lease_id
        rest = found.payload.encode("utf-8", "surrogateescape")
    return Record(
        **_common(IDEMPOTENCY, key, ref, letter, pttl, now),
        fingerprint=fingerprint,
        # while PROCESSING the record's time left is the claim's lock
        lease_expires_in_ms=pttl if letter == "P" and pttl >= 0 else None,
        response=_response_view(rest) if IDEMPOTENCY_STATES.get(letter) == "COMPLETED" else None,
        _lease_id=lease_id,
    )


@dataclass(frozen=True)
class Page:
    """Records found by one bounded step of a walk; ``cursor`` continues it ("0": the walk is over)."""

    records: list[Record]
    cursor: str
    scanned: int

    @property
    def done(self) -> bool:
        return self.cursor == "0"


# Filter's fields that a record meets by having the same value (its attribute of that name)
_EQUALS = ("kind", "state", "scope", "request_id", "lease_expired")


@dataclass(frozen=True)
class Filter:
    kind: str | None = None
    state: str | None = None
    scope: str | None = None
    request_id: str | None = None
    ref_prefix: str | None = None
    lease_expired: bool | None = None

    def matches(self, record: Record) -> bool:
        """Whether ``record`` meets every filter given: its ref starts with ``ref_prefix``, and
        each of the others equals the record's own of that name."""
        if self.ref_prefix is not None and not record.ref.startswith(self.ref_prefix):
            return False
        return all(getattr(self, name) in (None, getattr(record, name)) for name in _EQUALS)


def _letters(state: str | None) -> frozenset[str] | None:
    """The state letters of the records (either kind) in ``state``; None: any."""
    if state is None:
        return None
    tables = (TOKEN_STATES, IDEMPOTENCY_STATES)
    return frozenset(letter for table in tables for letter, name in table.items() if name == state)


@dataclass(frozen=True)
class _Resume:
    """Where a walk goes on: a node, the SCAN cursor of a batch and, mid-batch, how far into it.

    ``skip`` keys of that batch (sorted) were read already; the batch came from a SCAN with
    ``count`` (asked again with the same, whatever the next page's count) and ``batch`` is
    the digest of its keys, so they are skipped only if SCAN hands back the same batch.
    """

    node: int
    position: int
    skip: int = 0
    count: int = 0
    batch: str = ""

    def text(self) -> str:
        if self.skip:
            return f"{self.node}.{self.position}.{self.skip}.{self.count}.{self.batch}"
        return f"{self.node}.{self.position}"


# node[.scan cursor[.keys read of that batch.its SCAN count.its digest]]: ASCII digits only
# (str.isdigit also takes "²"), a SCAN cursor within what its unsigned 64 bits hold
_CURSOR_RE = re.compile(
    r"(?P<node>[0-9]{1,4})(?:\.(?P<position>[0-9]{1,20})"
    r"(?:\.(?P<skip>[1-9][0-9]{0,4})\.(?P<count>[1-9][0-9]{0,4})\.(?P<batch>[0-9a-f]{16}))?)?\Z"
)


def _unknown_cursor() -> InvalidRequest:
    """The 400 for a cursor this walk did not hand out: found so by its format here or by Redis's
    SCAN (one that reads fewer bits), the same answer either way."""
    return InvalidRequest("The cursor is not one this walk handed out.", {"cursor": ["Unknown cursor."]})


def _cursor(text: str, nodes: int) -> _Resume:
    matched = _CURSOR_RE.match(text or "0")
    if (
        matched is None
        or int(matched["node"]) >= max(nodes, 1)
        or int(matched["position"] or 0) >= 2**64
        or int(matched["count"] or 0) > MAX_COUNT
    ):
        raise _unknown_cursor()
    return _Resume(
        int(matched["node"]),
        int(matched["position"] or 0),
        int(matched["skip"] or 0),
        int(matched["count"] or 0),
        matched["batch"] or "",
    )


def _batch_digest(keys: list[str]) -> str:
    """What identifies one SCAN batch (its keys, sorted): 64 bits of their BLAKE2b."""
    hasher = hashlib.blake2b(digest_size=8)
    for key in keys:
        hasher.update(key.encode("utf-8", "surrogateescape") + b"\n")
    return hasher.hexdigest()


@contextlib.contextmanager
def _invalid_cursor() -> Iterator[None]:
    """Redis's own "invalid cursor" reply to SCAN is the caller's bad input: a 400, never a 500."""
    try:
        yield
    except redis_errors.ResponseError as exc:
        if "invalid cursor" not in str(exc).lower():
            raise
        raise _unknown_cursor() from exc


class Admin:
    """The operators' actions on one Redis (standalone, Sentinel master or Cluster).

    ``actor`` names who acts in the audit lines (the CLI's user, the admin key's label).
    """

    MAX_SCAN_STEPS_PER_PAGE: ClassVar[int] = 50
    # records read per pipeline once a read brought fewer matches than the page needed: this
    # many, four times more after each such read, up to MAX_READ
    FIRST_READ: ClassVar[int] = 16
    MAX_READ: ClassVar[int] = 1000

    def __init__(
        self,
        client: Any,
        *,
        key_prefix: str = defaults.KEY_PREFIX,
        result_ttl_seconds: int = defaults.RESULT_TTL_SECONDS,
        actor: str = "admin",
    ) -> None:
        self.client = client
        self.key_prefix = key_prefix
        self.result_ttl_seconds = result_ttl_seconds
        self.actor = actor
        self._cluster = isinstance(client, redis.cluster.RedisCluster)
        self._scripts = {name: client.register_script(lua_source(name)) for name in _SCRIPTS}
        self.records_read = 0  # records fetched from Redis by the walks of this object (what a page costs)

    # -- keys and references -------------------------------------------------------------

    def token_key(self, ref: str) -> str:
        return f"{self.key_prefix}t:{ref}"

    def idempotency_key(self, ref: str) -> str:
        return f"{self.key_prefix}ik:{ref}"

    def idempotency_ref(self, identity: str, idempotency_key: str) -> str:
        """The ref of an Idempotency-Key record: what the middleware's key is made of."""
        for name, value in (("identity", identity), ("idempotency_key", idempotency_key)):
            if not value or not is_plain_text(value):
                raise InvalidRequest(
                    f"Bad {name}.", {name: ["Not empty; no control characters or lone surrogates."]}
                )
        # as IdempotencyStore.key: 128 bits of the digest of both
        return idempotency_digest(identity, idempotency_key)[:FULL_REF_CHARS]

    def _split(self, key: str) -> tuple[str, str] | None:
        for kind, part in ((TOKEN, "t:"), (IDEMPOTENCY, "ik:")):
            head = self.key_prefix + part
            if key.startswith(head):
                return kind, key[len(head) :]
        return None

    # -- reading -------------------------------------------------------------------------

    def _read(self, kind: str, ref: str) -> Record | None:
        key = self.token_key(ref) if kind == TOKEN else self.idempotency_key(ref)
        with translate_errors():
            reply = self._scripts["admin_read"](keys=[key])
        return self._record(kind, key, ref, reply)

    @staticmethod
    def _record(kind: str, key: str, ref: str, reply: Any) -> Record | None:
        if not reply:
            return None
        value, pttl, now = reply[0], int(reply[1]), int(reply[2])
        if kind == TOKEN:
            return parse_token_record(key, ref, records.text(value), pttl, now)
        raw = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogateescape")
        return parse_idempotency_record(key, ref, raw, pttl, now)

    def _find(self, ref: str, kind: str | None) -> Record | None:
        check_ref(ref)
        if len(ref) != FULL_REF_CHARS:
            raise InvalidRequest(
                f"Only a full ref ({FULL_REF_CHARS} characters) names one record; look a shorter one up.",
                {"ref": [f"{FULL_REF_CHARS} characters."]},
            )
        if kind is not None and kind not in KINDS:
            raise InvalidRequest(f"kind is one of {', '.join(KINDS)}.", {"kind": ["Unknown kind."]})
        for candidate in (kind,) if kind else KINDS:
            found = self._read(candidate, ref)
            if found is not None:
                return found
        return None

    def _found(self, action: str, ref: str, kind: str | None) -> Record:
        found = self._find(ref, kind)
        if found is None:
            self._audit(action, ref, "not_found", kind=kind)
            raise RecordNotFound("No record under that reference (never issued, expired, or deleted).")
        return found

    def show(self, ref: str, kind: str | None = None) -> Record:
        """The record whose full ref (22 characters) this is: a token's, else an Idempotency-Key's."""
        found = self._found("show", ref, kind)
        self._audit("show", ref, "found", kind=found.kind, state=found.state)
        return found

    def show_idempotency(self, identity: str, idempotency_key: str) -> Record:
        return self.show(self.idempotency_ref(identity, idempotency_key), IDEMPOTENCY)

    # -- changing ------------------------------------------------------------------------

    def revoke(self, ref: str, kind: str | None = None) -> Record:
        """Delete the record whatever its state: a token can no longer be used, an
        Idempotency-Key's stored response is forgotten (the next request runs again)."""
        found = self._found("revoke", ref, kind)
        with translate_errors():
            reply = self._scripts["revoke"](keys=[found.key])
        outcome = "revoked" if records.text(reply[0]) == "revoked" else "not_found"
        self._audit("revoke", ref, outcome, kind=found.kind, state=found.state)
        if outcome == "not_found":
            raise RecordNotFound("The record went away before it could be revoked.")
        return found

    def release(self, ref: str, kind: str | None = None) -> str:
        """Free a record held by an operation in progress, as a retryable failure does.

        A token goes back to ISSUED (its lease is ended: a holder still running can
        no longer complete); an Idempotency-Key's claim is deleted, so the client's
        retry runs. Returns ``released``, or ``lease_expired`` when the lease had
        already run out (the token is usable again as it is).
        """
        found = self._found("release", ref, kind)
        if found.state != "PROCESSING":
            self._audit("release", ref, "not_in_progress", kind=found.kind, state=found.state)
            raise NotInProgress(f"The record is {found.state}: there is no operation in progress to release.")
        if not found._lease_id:
            self._audit("release", ref, "not_in_progress", kind=found.kind, state=found.state)
            raise NotInProgress(
                "The Idempotency-Key's claim was made before 0.2.0: it ends by itself when its lock runs out."
            )
        if found.kind == TOKEN and found.lease_expired:
            outcome = "lease_expired"
        else:
            # a token goes back to ISSUED; an Idempotency-Key's record is not remembered (kept 0 ms)
            keep_ms = str(self.result_ttl_seconds * 1000) if found.kind == TOKEN else "0"
            with translate_errors():
                reply = self._scripts["fail"](
                    keys=[found.key], args=[found._lease_id, "1", "null", keep_ms, ""]
                )
            outcome = records.text(reply[0])
            if outcome == "lease_lost" or (outcome == "token_invalid" and found.kind == IDEMPOTENCY):
                outcome = "changed"  # the holder finished (or a retry took over, or its lock ran out)
        self._audit("release", ref, outcome, kind=found.kind, state=found.state)
        if outcome == "changed":
            raise NotInProgress("The record changed while it was being released; show it again.")
        return outcome

    # -- walking ---------------------------------------------------------------------------

    def nodes(self) -> list[tuple[str, redis.Redis]]:
        """The clients to SCAN: the one server, or every primary of a Cluster (by address)."""
        if not self._cluster:
            return [("", self.client)]
        primaries = sorted(self.client.get_primaries(), key=lambda node: node.name)
        return [(node.name, self.client.get_redis_connection(node)) for node in primaries]

    def _pattern(self, wanted: Filter) -> str:
        refs = (wanted.ref_prefix or "") + "*"
        if wanted.kind == TOKEN:
            return self.token_key(refs)
        if wanted.kind == IDEMPOTENCY:
            return self.idempotency_key(refs)
        if wanted.ref_prefix is not None:
            # either kind's key ("t:" or "ik:" before the ref); a key of another kind that the
            # pattern lets through is not a record (_split) or fails Filter.matches
            return f"{self.key_prefix}[ti]*:{refs}"
        return self.key_prefix + "*"

    def scan(self, wanted: Filter, cursor: str = "0", count: int = DEFAULT_COUNT, limit: int = 100) -> Page:
        """At most ``limit`` records matching ``wanted``, from a bounded walk that starts at ``cursor``.

        Each step is one ``SCAN … COUNT count`` (key names only); the records of its keys are
        then read a few at a time, and reading stops as soon as the page holds ``limit``
        records, so a page's memory is bounded by ``limit``, not by ``count``. A page that
        fills mid-batch hands back a cursor naming the batch's SCAN cursor, how many of its
        keys (sorted) were read and the batch's digest: the next page issues that SCAN
        again and, if it returns the same keys, goes on after them. If the batch changed
        meanwhile (keys written or deleted there, or the hash table resized, after which one
        SCAN cursor covers other keys), it is read again from its start.

        The guarantee (SCAN's own, kept across pages): every record present for the whole
        walk is listed at least once; when nothing changes, exactly once. A record written
        or deleted during the walk may or may not be listed.

        A page also ends after :attr:`MAX_SCAN_STEPS_PER_PAGE` SCAN calls, so it may be
        empty while the walk goes on. Continue with the returned cursor until it is ``"0"``.
        """
        if not 1 <= count <= MAX_COUNT:
            raise ValueError(f"count must be between 1 and {MAX_COUNT}")
        if limit < 1:
            raise ValueError("limit must be at least 1")
        nodes = self.nodes()
        at = _cursor(cursor, len(nodes))
        node, position, skip = at.node, at.position, at.skip
        pattern = self._pattern(wanted)
        letters = _letters(wanted.state)
        found: list[Record] = []
        scanned = 0
        steps = 0
        with translate_errors(), _invalid_cursor():
            while steps < self.MAX_SCAN_STEPS_PER_PAGE and len(found) < limit:
                steps += 1
                client = nodes[node][1]
                # a batch begun by an earlier page is asked for as it was (its count), the others with ours
                asked = at.count if skip else count
                following, raw_keys = client.scan(position, match=pattern, count=asked, _type="string")
                # sorted, once each: the same batch is the same list whatever order SCAN replied in
                keys = sorted({records.text(raw) for raw in raw_keys})
                batch = _batch_digest(keys)
                if skip and (batch != at.batch or skip > len(keys)):
                    skip = 0  # not the batch the cursor was handed out for: all of it again
                extra = 0
                while skip < len(keys) and len(found) < limit:
                    # as many as the page still needs, then more each time a read brought too few
                    # (records another filter refuses, keys gone): never more than MAX_READ beyond it
                    wanted_keys = keys[skip : skip + max(limit - len(found), extra)]
                    for offset, record in enumerate(self._read_many(client, wanted_keys, letters)):
                        if record is not None and wanted.matches(record):
                            found.append(record)
                            if len(found) == limit:
                                wanted_keys = wanted_keys[: offset + 1]
                                break
                    skip += len(wanted_keys)
                    scanned += len(wanted_keys)
                    extra = min(max(extra * 4, self.FIRST_READ), self.MAX_READ)
                if skip < len(keys):
                    return Page(found, _Resume(node, position, skip, asked, batch).text(), scanned)
                skip = 0
                position = int(following)
                if position == 0:
                    node += 1
                    if node == len(nodes):
                        return Page(found, "0", scanned)
        return Page(found, _Resume(node, position).text(), scanned)

    def _read_many(
        self, node: redis.Redis, keys: list[str], letters: frozenset[str] | None = None
    ) -> list[Record | None]:
        """The records under ``keys``, one per key (None: not a record, gone, or another state)."""
        script = self._scripts["admin_read"]
        named = [self._split(key) for key in keys]
        wanted = [key for key, split in zip(keys, named, strict=True) if split is not None]
        if not wanted:
            return [None] * len(keys)
        replies = iter(self._read_replies(node, script, wanted))
        shown: list[Record | None] = []
        for key, split in zip(keys, named, strict=True):
            if split is None:
                shown.append(None)
                continue
            reply = next(replies)
            if isinstance(reply, Exception):
                shown.append(None)  # moved to another node meanwhile (a Cluster reshard): its walk lists it
            elif letters is not None and reply and records.text(reply[0][:1]) not in letters:
                shown.append(None)  # another state: not worth parsing
            else:
                shown.append(self._record(split[0], key, split[1], reply))
        return shown

    def _read_replies(self, node: redis.Redis, script: Any, keys: list[str]) -> list[Any]:
        self.records_read += len(keys)
        replies = self._pipeline_read(node, script.sha, keys)
        if any(isinstance(reply, redis_errors.NoScriptError) for reply in replies):
            node.script_load(script.script)  # this node had not seen the script yet
            replies = self._pipeline_read(node, script.sha, keys)
        return replies

    @staticmethod
    def _pipeline_read(node: redis.Redis, sha: str, keys: list[str]) -> list[Any]:
        pipe = node.pipeline(transaction=False)
        for key in keys:
            pipe.execute_command("EVALSHA", sha, 1, key)  # type: ignore[no-untyped-call]
        return list(pipe.execute(raise_on_error=False))

    def walk(
        self, wanted: Filter, count: int = DEFAULT_COUNT, pause_seconds: float = 0.0
    ) -> Iterator[Record]:
        """Every matching record, page after page (each page bounded as in :meth:`scan`)."""
        cursor = "0"
        while True:
            page = self.scan(wanted, cursor, count)
            yield from page.records
            if page.done:
                return
            cursor = page.cursor
            if pause_seconds:
                time.sleep(pause_seconds)

    def list(self, wanted: Filter, cursor: str = "0", count: int = DEFAULT_COUNT, limit: int = 100) -> Page:
        page = self.scan(wanted, cursor, count, limit)
        self._audit(
            "list",
            None,
            f"{len(page.records)} found",
            kind=wanted.kind,
            state=wanted.state,
            scope=wanted.scope,
            cursor=page.cursor,
        )
        return page

    def find_by_request_id(
        self, request_id: str, cursor: str = "0", count: int = DEFAULT_COUNT, limit: int = 100
    ) -> Page:
        page = self.scan(Filter(kind=TOKEN, request_id=request_id), cursor, count, limit)
        self._audit("find_by_request_id", None, f"{len(page.records)} found", cursor=page.cursor)
        return page

    def find_by_ref_prefix(
        self,
        prefix: str,
        cursor: str = "0",
        count: int = DEFAULT_COUNT,
        limit: int = 100,
        wanted: Filter | None = None,
    ) -> Page:
        """The records of either kind (or ``wanted.kind``) whose ref starts with ``prefix`` and that
        match ``wanted``'s other filters too."""
        check_ref(prefix)
        page = self.scan(replace(wanted or Filter(), ref_prefix=prefix), cursor, count, limit)
        self._audit("find_by_ref_prefix", prefix, f"{len(page.records)} found", cursor=page.cursor)
        return page

    # -- audit -----------------------------------------------------------------------------

    def _audit(self, action: str, ref: str | None, outcome: str, **details: Any) -> None:
        audit(self.actor, action, ref, outcome, **details)

    # -- for the reconciler --------------------------------------------------------------

    def _take_over(self, found: Record, lease_seconds: int) -> str | None:
        """A fresh lease on a PROCESSING token whose lease ran out, or None if it moved on."""
        lease_id = new_lease_id()
        # the record's own binding, sent again (its key stands where a token would: none is known)
        rid = "reconciler:" + lease_id[:12]
        use = UseRequest(found.key, found.scope or "", found.subject, found.fingerprint, rid)
        args = records.begin_args(use, lease_seconds, lease_id, "")
        with translate_errors():
            reply = self._scripts["begin"](keys=[found.key], args=args)
        if isinstance(reply, int):  # begin.lua's bare answer: a new lease (records.begin_reply)
            return lease_id
        if not isinstance(reply, list) or records.text(reply[0]) != "started" or int(reply[3]) == 1:
            return None
        return lease_id

    def _finish(self, found: Record, lease_id: str, outcome: Any) -> str:
        ttl_ms = str(self.result_ttl_seconds * 1000)
        with translate_errors():
            if outcome.action == "complete":
                args = records.complete_args(lease_id, outcome.value, self.result_ttl_seconds, "")
                reply = self._scripts["complete"](keys=[found.key], args=args)
            else:
                retryable = "1" if outcome.action == "release" else "0"
                args = [lease_id, retryable, records.dump_json(outcome.value), ttl_ms, ""]
                reply = self._scripts["fail"](keys=[found.key], args=args)
        return "succeeded" if reply == 0 else records.text(reply[0])  # 0: complete.lua stored it
