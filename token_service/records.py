"""What each token operation sends to its Lua script and what its reply means.

Pure functions, no I/O: the sync and async stores (and every transport of the
SDK) share them, so a reply is interpreted the same way everywhere. Each
``*_args`` builds the ARGV of the script of the same name in ``lua/``; each
``*_reply`` turns the script's ``{code, ...}`` reply into a result object or
raises the matching :mod:`token_service.errors` class.

The values the operations pass down (:class:`IssueRequest`, :class:`UseRequest`)
and get back (:class:`Consumed`, :class:`Started`, …) live here, beside the
codec, not in the I/O module: :mod:`token_service.store` imports this module,
never the reverse (``tests/test_layout.py`` holds the import graph free of cycles).

The record itself (its two layouts are drawn in ``lua/_record.lua``) is read by
:func:`read_record`, the one Python reader of it, and a keyed operation's
PROCESSING record is written by :func:`claim_value` for the plain
``SET NX GET PX`` claim (:meth:`token_service.store.TokenStore.begin`), whose
returned record :func:`claim_reply` decides on, or hands to ``begin.lua``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

from token_service.errors import (
    InvalidRequest,
    LeaseLost,
    TokenFailed,
    TokenInProgress,
    TokenInvalid,
    TokenMismatch,
    TokenUsed,
)
from token_service.tokens import new_request_id

__all__ = [
    "MAX_PAYLOAD_DEPTH",
    "Completed",
    "Consumed",
    "FailRecorded",
    "Finished",
    "Inspection",
    "IssueRequest",
    "JsonText",
    "Renewed",
    "Reply",
    "Started",
    "UseRequest",
    "begin_args",
    "begin_reply",
    "check_payload",
    "complete_args",
    "complete_reply",
    "consume_args",
    "consume_reply",
    "dump_json",
    "fail_args",
    "fail_reply",
    "inspect_reply",
    "opt",
    "raise_for",
    "renew_args",
    "renew_reply",
    "revoke_reply",
    "text",
]

Reply = list[Any]


@dataclass(frozen=True, slots=True)
class IssueRequest:
    scope: str
    subject: str | None
    fingerprint: str | None
    ttl_seconds: int

    def args(self, bucket: str = "") -> list[str]:
        return [
            self.scope,
            opt(self.subject),
            opt(self.fingerprint),
            str(self.ttl_seconds * 1000),
            bucket,
        ]


# Not frozen, unlike IssueRequest: one is made on every consume and begin, and a frozen
# dataclass's __init__ (object.__setattr__ per field) costs 9,500 instructions to this one's
# 2,700 (callgrind), a third more on a store consume's own 19,000. Nothing changes one once made.
@dataclass(slots=True)
class UseRequest:
    """One use of a token (consume, begin): the one value the server, the SDK's transports and
    the store pass along, as :class:`IssueRequest` is for issue.

    ``token`` is the token, or a keyed operation's name (its digest makes the record key as a
    token's does). ``request_id`` None (or ''): the store draws one, and a retry cannot be told
    from a second use.
    """

    token: str
    scope: str
    subject: str | None = None
    fingerprint: str | None = None
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class Consumed:
    replayed: bool


@dataclass(frozen=True, slots=True)
class Started:
    """begin took (or, on a retry with the same request id, gave back) a lease.

    ``lease_seconds`` is how long the lease runs from when Redis answered (what is left
    of it on a retried begin; None from a service that does not say): a duration, to
    measure on the caller's monotonic clock from when it sent the begin.
    ``lease_expires_ms`` is the same end on Redis's clock, for display: compared with
    the caller's wall clock it is off by however far that clock is off.
    """

    lease_id: str
    lease_expires_ms: int
    replayed: bool = False
    # what was left when Redis answered, not part of which lease this is
    lease_seconds: float | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Finished:
    """begin found the operation already SUCCEEDED: ``result`` is the stored outcome."""

    result: Any


@dataclass(frozen=True, slots=True)
class Renewed:
    """renew extended the live lease: it now runs ``lease_seconds`` from when Redis answered
    (None from a service that does not say), until ``lease_expires_ms`` on Redis's clock."""

    lease_expires_ms: int
    lease_seconds: float | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Completed:
    replayed: bool


@dataclass(frozen=True, slots=True)
class FailRecorded:
    """fail's outcome: ``released`` for a retryable failure, else ``failed``."""

    outcome: str
    replayed: bool


@dataclass(frozen=True, slots=True)
class Inspection:
    state: str
    scope: str
    subject: str | None
    fingerprint: str | None
    record_ttl_ms: int
    lease_expires_ms: int | None = None
    result: Any = None
    error: Any = None


def text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def opt(value: str | None) -> str:
    return value or ""


# compact and ASCII-only: the record stays small and \31 can never appear raw; no NaN/Infinity:
# stored, they would make every later reply invalid JSON. Made once: json.dumps given options
# builds this encoder on every call (a guarded call dumps two or three times).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def dump_json(value: Any) -> str:
    return _ENCODER.encode(value)


MAX_PAYLOAD_DEPTH = 64


class JsonText(str):
    """A value's JSON as :func:`check_payload` dumped it: a store's ``complete`` or ``fail`` given
    one stores it as it is instead of dumping the value again."""

    __slots__ = ()


def check_payload(name: str, value: Any, max_bytes: int) -> JsonText:
    """Refuse a result/error that cannot be stored: not JSON, nested too deeply, or too large;
    else its JSON (:class:`JsonText`), to hand to the store's ``complete`` in its place.

    Shared by the API and the SDK's direct transport, so both refuse the same values
    with the same 400 before anything is written. The depth is capped explicitly:
    whether json.dumps hits Python's recursion limit depends on how deep the caller's
    stack already is, so "it serialized once" proves nothing for the next call. The
    value is walked only when its JSON has more than MAX_PAYLOAD_DEPTH brackets (or did
    not dump): nesting needs a bracket a level, and counting them is C-fast.
    """
    try:
        dumped = JsonText(dump_json(value))
    except (TypeError, ValueError, RecursionError) as exc:
        if _nested_deeper_than(value, MAX_PAYLOAD_DEPTH):
            raise _too_deep(name) from None
        if isinstance(exc, RecursionError):
            raise  # not nested too deeply: the caller's own stack was nearly spent
        raise InvalidRequest(
            f"The {name} is not JSON.", {name: ["Must be JSON (no NaN or Infinity)."]}
        ) from None
    if dumped.count("[") + dumped.count("{") > MAX_PAYLOAD_DEPTH and _nested_deeper_than(
        value, MAX_PAYLOAD_DEPTH
    ):
        raise _too_deep(name)
    if len(dumped) > max_bytes:
        raise InvalidRequest(
            f"The {name} is too large to store.", {name: [f"At most {max_bytes} bytes of JSON."]}
        )
    return dumped


def _too_deep(name: str) -> InvalidRequest:
    return InvalidRequest(
        f"The {name} is nested too deeply.", {name: [f"At most {MAX_PAYLOAD_DEPTH} levels of nesting."]}
    )


def _nested_deeper_than(value: Any, limit: int) -> bool:
    # iterative: a recursive walk would itself hit the recursion limit it guards against
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False


def _load_json(raw: Any) -> Any:
    raw_text = text(raw)
    return json.loads(raw_text) if raw_text else None


def _seconds_from_ms(ms: Any) -> int:
    return max(1, math.ceil(int(ms) / 1000))


def raise_for(reply: Reply) -> None:
    """Raise the error a script reported, if it reported one."""
    code = text(reply[0])
    if code == "token_invalid":
        raise TokenInvalid("The token is unknown, expired or revoked.")
    if code == "token_mismatch":
        field_name = text(reply[1])
        raise TokenMismatch(f"The token's {field_name} does not match this request.", field=field_name)
    if code == "token_used":
        raise TokenUsed("The token has already been used.")
    if code == "token_in_progress":
        seconds = _seconds_from_ms(reply[1])
        raise TokenInProgress(
            f"Another request holds this token; retry in {seconds} s.", retry_after_seconds=seconds
        )
    if code == "token_failed":
        raise TokenFailed("The operation failed for good.", error=_load_json(reply[1]))
    if code == "lease_lost":
        raise LeaseLost("The lease is not the live one: it expired or was taken over.")
    if code == "invalid_argument":
        raise InvalidRequest(f"Rejected by the store: {text(reply[1])}.")


# The record's separators (lua/_record.lua): between fields, and after the letter of a
# leased record (PROCESSING, SUCCEEDED, FAILED) in the lease-header layout.
SEP = "\x1f"
HEADED = "\x1e"
STATES = {"I": "ISSUED", "P": "PROCESSING", "C": "CONSUMED", "S": "SUCCEEDED", "F": "FAILED"}


# Not frozen: a keyed replay reads one (records.claim_reply), and a frozen dataclass's
# __init__ (object.__setattr__ per field) costs several times a plain one's (callgrind).
@dataclass(slots=True)
class StoredRecord:
    """A token record's fields, as lua/_record.lua lays them out (either layout).

    ``lease_expires_ms`` and ``token_expires_ms`` are on Redis's clock, None when
    not in the record (a keyed claim's lease is its key's own expiry);
    ``bucket`` is the client bucket an ISSUED token is counted in ('' for none).
    """

    state: str  # the letter: I, P, C, S, F (anything else: not a token record)
    scope: str
    subject: str
    fingerprint: str
    request_id: str
    lease_id: str
    lease_expires_ms: int | None
    token_expires_ms: int | None
    bucket: str
    payload: str


def read_record(value: str | bytes) -> StoredRecord:
    """The fields of a stored token record (``lua/_record.lua``'s ``parse``, in Python)."""
    raw = text(value)
    letter = raw[:1]
    if raw[1:2] == HEADED:
        parts = raw[2:].split(SEP, 7)
        parts += [""] * (8 - len(parts))
        lease_id, lease_expires, token_expires, request_id, scope, subject, fingerprint, payload = parts
        bucket = ""
    else:
        parts = raw[1:].split(SEP, 7)
        parts += [""] * (8 - len(parts))
        scope, subject, fingerprint, request_id, lease_id, sixth, token_expires, payload = parts
        # field 6: a first-layout PROCESSING record's lease end, an ISSUED one's bucket
        lease_expires, bucket = (sixth, "") if letter == "P" else ("", sixth)
    return StoredRecord(
        state=letter,
        scope=scope,
        subject=subject,
        fingerprint=fingerprint,
        request_id=request_id,
        lease_id=lease_id,
        lease_expires_ms=int(lease_expires) if lease_expires.isdigit() else None,
        token_expires_ms=int(token_expires) if token_expires.isdigit() else None,
        bucket=bucket,
        payload=payload,
    )


def claim_value(use: UseRequest, lease_id: str, request_id: str) -> str:
    """A keyed operation's PROCESSING record for the plain claim (``SET key value NX GET PX lease``).

    The lease-header layout with both expiries empty: the lease is the key's own
    expiry. Its fields were checked by the caller (no control characters: the
    keyed transport's checks, which the API's schemas would make).
    """
    binding = f"{use.scope}{SEP}{use.subject or ''}{SEP}{use.fingerprint or ''}"
    return f"P{HEADED}{lease_id}{SEP}{SEP}{SEP}{request_id}{SEP}{binding}"


def claim_reply(
    previous: Any, use: UseRequest, lease_id: str, lease_seconds: int
) -> Started | Finished | None:
    """What the plain claim's reply decides: the claim (nothing was there), a stored outcome,
    or None: begin.lua decides (a released record, another holder, a lost reply's own claim,
    a record of the first layout), as one compare-and-change."""
    if previous is None:
        # Display only, as the service's lease_expires_at: this host's clock, not Redis's.
        expires_ms = int(time.time() * 1000) + lease_seconds * 1000
        return Started(lease_id, expires_ms, False, float(lease_seconds))
    raw = text(previous)
    if raw[1:2] != HEADED or raw[:1] not in ("S", "F"):
        return None
    found = read_record(raw)
    if found.scope != use.scope:
        raise_for(["token_mismatch", "scope"])
    if found.subject != (use.subject or ""):
        raise_for(["token_mismatch", "subject"])
    if found.fingerprint != (use.fingerprint or ""):
        raise_for(["token_mismatch", "fingerprint"])
    if found.state == "S":
        return Finished(result=_load_json(found.payload))
    raise_for(["token_failed", found.payload])
    return None  # unreachable: raise_for raised


def consume_args(use: UseRequest, now_ms: str) -> list[str]:
    """consume.lua's ARGV for ``use`` (without a request id, a new one: no retry can match it)."""
    return [
        use.scope,
        use.subject or "",  # opt(), inlined
        use.fingerprint or "",
        use.request_id or new_request_id(),
        now_ms,
    ]


# Consumed is immutable: the two possible answers are made once, not per consume.
_CONSUMED = Consumed(replayed=False)
_CONSUMED_REPLAYED = Consumed(replayed=True)


def consume_reply(reply: Reply) -> Consumed:
    code = reply[0]
    if code == b"consumed" or code == "consumed":
        # the usual answer, read without raise_for's walk through the error codes
        return _CONSUMED_REPLAYED if int(reply[1]) == 1 else _CONSUMED
    raise_for(reply)
    return Consumed(replayed=int(reply[1]) == 1)


def begin_args(
    use: UseRequest, lease_seconds: int, lease_id: str, now_ms: str, claim_ttl_seconds: int | None = None
) -> list[str]:
    """begin.lua's ARGV for ``use`` (``use.token`` is not in it: the record key says whose it is)."""
    args = [
        use.scope,
        use.subject or "",  # opt(), inlined
        use.fingerprint or "",
        use.request_id or new_request_id(),
        str(lease_seconds * 1000),
        lease_id,
    ]
    if claim_ttl_seconds is not None:
        # a keyed operation: no token was issued, an absent record is claimed for this long
        args += (now_ms, str(claim_ttl_seconds * 1000))
    elif now_ms:  # else left out, as Redis's clock: an argument costs the script ~1 k instructions
        args.append(now_ms)
    return args


def begin_reply(reply: Reply | int | bytes | str, args: list[str]) -> Started | Finished:
    """begin.lua's reply to ``args`` (:func:`begin_args`'): its two usual answers come bare, a new
    lease's ``lease_expires_ms`` (the lease drawn for ``args``, as long as they asked) and a
    replayed result's JSON; anything else is a table."""
    kind = type(reply)
    if kind is int:
        return Started(args[5], reply, False, int(args[4]) / 1000)  # type: ignore[arg-type]
    if kind is bytes or kind is str:
        return Finished(result=_load_json(reply))
    assert isinstance(reply, list)
    if text(reply[0]) == "succeeded":
        return Finished(result=_load_json(reply[1]))
    raise_for(reply)
    return Started(
        lease_id=text(reply[1]),
        lease_expires_ms=int(reply[2]),
        replayed=int(reply[3]) == 1,
        lease_seconds=int(reply[5]) / 1000,
    )


def _lease(lease_id: str) -> str:
    """A lease id as renew, complete and fail compare it with the record's lease header: the
    scripts take it as a prefix and trust it to hold no separator, so it is checked here."""
    if not lease_id or SEP in lease_id or HEADED in lease_id:
        raise InvalidRequest("Rejected by the store: a lease_id is required, without control characters.")
    return lease_id


def renew_args(lease_id: str, lease_seconds: int, now_ms: str) -> list[str]:
    return [_lease(lease_id), str(lease_seconds * 1000), now_ms]


def renew_reply(reply: Reply) -> Renewed:
    raise_for(reply)
    return Renewed(lease_expires_ms=int(reply[1]), lease_seconds=int(reply[2]) / 1000)


def _ttl_ms(name: str, seconds: int) -> str:
    """A keep time as the scripts take it: a positive whole number of ms (checked here: the
    keyed complete's fast path hands it to SET PX as it is)."""
    if type(seconds) is not int or seconds <= 0:
        raise InvalidRequest(f"Rejected by the store: {name} must be a positive whole number of seconds.")
    return str(seconds * 1000)


def complete_args(
    lease_id: str, result: Any, result_ttl_seconds: int, now_ms: str, claimed: str | None = None
) -> list[str]:
    """complete.lua's ARGV. ``claimed``: the record this caller's plain keyed claim wrote
    (:func:`claim_value`), for the script's fast path, which puts the SUCCEEDED record built
    here in its place (the claim with 'S' for 'P', the result last: sent once, in it). A
    ``result`` that is :class:`JsonText` (:func:`check_payload`'s) is stored as it is."""
    result_json = result if type(result) is JsonText else dump_json(result)
    keep_ms = _ttl_ms("result_ttl_seconds", result_ttl_seconds)
    if claimed is not None:  # three arguments: the keyed claim's (complete.lua)
        return [_lease(lease_id), f"S{claimed[1:]}{SEP}{result_json}", keep_ms]
    return [_lease(lease_id), result_json, keep_ms, now_ms]


_COMPLETED = Completed(replayed=False)


def complete_reply(reply: Reply | int) -> Completed:
    if isinstance(reply, int):  # 0, complete.lua's usual answer: stored
        return _COMPLETED
    raise_for(reply)
    return Completed(replayed=int(reply[1]) == 1)


def fail_args(lease_id: str, retryable: bool, error: Any, result_ttl_seconds: int, now_ms: str) -> list[str]:
    """fail.lua's ARGV (an ``error`` that is :class:`JsonText` is stored as it is)."""
    return [
        _lease(lease_id),
        "1" if retryable else "0",
        error if type(error) is JsonText else dump_json(error),
        str(result_ttl_seconds * 1000),
        now_ms,
    ]


def fail_reply(reply: Reply) -> FailRecorded:
    raise_for(reply)
    return FailRecorded(outcome=text(reply[0]), replayed=int(reply[1]) == 1)


def inspect_reply(reply: Reply) -> Inspection:
    if not reply:
        raise TokenInvalid("The token is unknown, expired or revoked.")
    state, scope, subject, fingerprint, ttl_ms, lease, payload = (text(part) for part in reply)
    stored = _load_json(payload)
    return Inspection(
        state=state,
        scope=scope,
        subject=subject or None,
        fingerprint=fingerprint or None,
        record_ttl_ms=int(ttl_ms),
        lease_expires_ms=int(lease) if lease else None,
        result=stored if state == "SUCCEEDED" else None,
        error=stored if state == "FAILED" else None,
    )


def revoke_reply(reply: Reply) -> None:
    raise_for(reply)
