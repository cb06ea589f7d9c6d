"""Issuance limits: who a client is, and what ``lua/admit.lua`` is asked and answers.

Pure, like :mod:`token_service.records`: the store runs the script, the API
decides who the client is. A client is the trusted subject when the gateway
sets one (``TOKEN_SERVICE_SUBJECT_HEADER``), else the network of the client
address (after ``ProxyFix`` for the configured proxy hops; :func:`address_group`):
an IPv6 host is given a whole /64, so its addresses are one client. A subject in
the request body is never an identity here: anyone can write any subject into a body.

A token issued under an outstanding cap carries its client's id (the digest
in the client's limit key) after its 43 random characters, so that whoever
consumes, begins or revokes it can name the client's limit record in the
script's KEYS: the token stops counting at once, in the same round trip. The
id is bound to the token (the record key is a digest of the whole token), so
changing it gives an unknown token, never another client's count.

The **anonymous budget** (:class:`Budget`) bounds what every client together
may hold: one record (:func:`budget_key`) counts the outstanding tokens of all
of them, and the bytes of Redis memory they take (:func:`token_bytes`, an upper
bound of what ``MEMORY USAGE`` and ``used_memory`` measure), until each is
consumed, begun, revoked or expires, whatever its TTL: memory is held that long.
The client records and the budget share one hash slot (the ``{l}`` in their
keys), so that one admit call names both in its KEYS on Redis Cluster too.
:class:`MemoryReserve` keeps issuance below a share of Redis's ``maxmemory``
by lowering the budget's byte limit to what the last reading leaves free.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import ipaddress
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from token_service.config import RateLimit
from token_service.errors import (
    InvalidRequest,
    IssuancePaused,
    OutstandingCapReached,
    RateLimited,
    ServiceUnavailable,
)
from token_service.records import raise_for, text
from token_service.tokens import TOKEN_CHARS

__all__ = [
    "CLIENT_ID_CHARS",
    "MAX_BUDGET_RETRY_SECONDS",
    "MAX_COUNTED_SECONDS",
    "NO_BUDGET",
    "Budget",
    "IssuanceLimits",
    "MemoryReading",
    "MemoryReserve",
    "address_group",
    "admit_reply",
    "budget_key",
    "client_key",
    "client_key_of",
    "client_tag",
    "memory_allowance",
    "parse_budget_record",
    "parse_limit_record",
    "token_bytes",
]

# A token counts toward the outstanding cap for at most this long, whatever its TTL:
# the bound on how long a client can be refused by the cap (plus its bucket's rounding,
# at most a quarter of it). A 24 h token held unused stops counting after about an hour.
MAX_COUNTED_SECONDS = 3600
# An id is base64url of 16 digest bytes, unpadded.
CLIENT_ID_CHARS = 22
# "{l}:" (not the "l:" or "c:" of earlier versions, whose records expire on their own): the
# braces put every client record and the budget in one Redis Cluster hash slot
_CLIENT_INFIX = "{l}:"
_BUDGET_NAME = "anonymous"  # never a client id (22 characters)
_BUDGET_SETTING = "TOKEN_SERVICE_ANONYMOUS_MAX_OUTSTANDING"
# The budget's Retry-After is at most this: a refusal for everyone is worth asking again soon
# (tokens are consumed all the time), whatever the end of the budget's oldest bucket.
MAX_BUDGET_RETRY_SECONDS = 60

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Budget:
    """What anonymous issuance may hold across all clients (0: no such limit).

    ``memory_percent``: issuance is refused once Redis's ``used_memory`` would pass this share
    of its ``maxmemory`` (:class:`MemoryReserve`). The budget's record is kept when any of
    the three is set: the reserve needs its count of bytes.
    """

    max_tokens: int = 0
    max_bytes: int = 0
    memory_percent: int = 0

    @property
    def kept(self) -> bool:
        return self.max_tokens > 0 or self.max_bytes > 0 or self.memory_percent > 0


NO_BUDGET = Budget()


@dataclass(frozen=True, slots=True)
class IssuanceLimits:
    rate: RateLimit | None
    max_outstanding: int  # 0: no cap
    budget: Budget = NO_BUDGET

    @property
    def enabled(self) -> bool:
        return self.rate is not None or self.max_outstanding > 0 or self.budget.kept

    @property
    def counts_outstanding(self) -> bool:
        """Whether admit counts the tokens until they are used (the cap, the budget): they then
        carry their client's id, so that a consume can name the records that count them."""
        return self.max_outstanding > 0 or self.budget.kept

    def check_count(self, count: int) -> None:
        """A batch larger than a limit can never be admitted: a ``400 invalid_request`` on ``count``.

        Not a 429: its ``Retry-After`` promised a later success that cannot come (a
        client that honours it waits a period and is refused again, for ever). The
        field error names the largest batch that can pass.
        """
        if self.rate is not None and count > self.rate.limit:
            raise InvalidRequest(
                f"A batch of {count} can never pass the issuance rate limit of "
                f"{self.rate.limit} per {self.rate.period_seconds} s: ask for at most {self.rate.limit}.",
                {
                    "count": [
                        f"At most {self.rate.limit}: the issuance rate limit (TOKEN_SERVICE_RATE_LIMIT)."
                    ]
                },
            )
        if self.max_outstanding and count > self.max_outstanding:
            raise InvalidRequest(
                f"A batch of {count} can never pass the cap of {self.max_outstanding} outstanding "
                f"tokens per client: ask for at most {self.max_outstanding}.",
                {
                    "count": [
                        f"At most {self.max_outstanding}: the cap on a client's outstanding tokens "
                        "(TOKEN_SERVICE_MAX_OUTSTANDING_PER_SUBJECT)."
                    ]
                },
            )
        most = self.budget.max_tokens
        if most and count > most:
            raise InvalidRequest(
                f"A batch of {count} can never pass the budget of {most} outstanding anonymous tokens: "
                f"ask for at most {most}.",
                {"count": [f"At most {most}: the anonymous budget ({_BUDGET_SETTING})."]},
            )

    def args(
        self, count: int, ttl_seconds: int, now_ms: str, token_bytes: int = 0, max_bytes: int | None = None
    ) -> list[str]:
        """admit.lua's ARGV; with the budget kept also ARGV[7..10]: its limits, ``token_bytes``
        (what each token is charged, :func:`token_bytes`) and how long the tokens live.
        ``max_bytes``: the byte limit of this call (:class:`MemoryReserve`), else the budget's."""
        limit, period_seconds = (self.rate.limit, self.rate.period_seconds) if self.rate else (0, 1)
        args = [
            str(count),
            str(limit),
            str(period_seconds * 1000),
            str(self.max_outstanding),
            str(min(ttl_seconds, MAX_COUNTED_SECONDS) * 1000),
            now_ms,
        ]
        budget = self.budget
        if budget.kept and token_bytes > 0:
            args += [
                str(budget.max_tokens),
                str(budget.max_bytes if max_bytes is None else max_bytes),
                str(token_bytes),
                str(ttl_seconds * 1000),
            ]
        return args


def _allocation(size: int) -> int:
    """What jemalloc (Redis's allocator) hands out for ``size`` bytes: its size classes."""
    if size <= 8:
        return 8
    if size <= 128:
        return -(-size // 16) * 16
    step = 1 << ((size - 1).bit_length() - 3)  # four classes per doubling
    return -(-size // step) * step


# Redis's own cost of a key with an expiry, beyond the allocations of its name and value:
# the object header, the entries of the key space and of the expiry table (80 bytes), their
# hash tables' slots at their emptiest (32: half full, just after they grew), and 16 to spare.
# Measured on Redis 7.0 (docs/topologies.md; tests/scale/test_token_sizing.py holds the
# charge above what used_memory grows by per token).
_KEY_OVERHEAD_BYTES = 128
# The longest field 6 of an ISSUED record: "<client bucket>/<budget bucket>/<bytes>"
_BUCKET_FIELD_CHARS = 10 + 1 + 10 + 1 + 6


def token_bytes(key_prefix: str, scope: str, subject: str | None, fingerprint: str | None) -> int:
    """What one ISSUED token's record costs Redis at most (``used_memory``), in bytes.

    Its key (``<prefix>t:<22 characters>``) and its value (a state letter, the scope,
    subject and fingerprint in UTF-8, five separators and field 6), each rounded up to
    the allocator's size class, plus Redis's per-key overhead.
    """
    fields = len(scope.encode()) + len(subject.encode() if subject else b"")
    fields += len(fingerprint.encode() if fingerprint else b"")
    key = len(key_prefix) + 2 + CLIENT_ID_CHARS
    value = 1 + fields + 5 + _BUCKET_FIELD_CHARS
    # sds strings: a 3-byte header below 256 characters (5 above) and a terminating NUL
    return _KEY_OVERHEAD_BYTES + _allocation(key + 4) + _allocation(value + (4 if value < 256 else 6))


def budget_key(key_prefix: str) -> str:
    """The anonymous budget's record: one per deployment, in the client records' hash slot."""
    return f"{key_prefix}{_CLIENT_INFIX}{_BUDGET_NAME}"


def parse_budget_record(value: bytes | str | None) -> tuple[int, int]:
    """(tokens, bytes) the budget's record counts, as lua/admit.lua writes it ("<n>:<b>|...")."""
    if value is None:
        return 0, 0
    text_value = value.decode("ascii") if isinstance(value, bytes) else value
    tokens, _, rest = text_value.partition(":")
    return int(tokens), int(rest.partition("|")[0])


# What a store reads for the reserve: (used_memory, maxmemory) of each Redis that holds
# tokens (one; a cluster's primaries), and the bytes the budget's record counts.
MemoryReading = tuple[Sequence[tuple[int, int]], int]


def memory_allowance(reading: MemoryReading, percent: int) -> int | None:
    """The bytes the budget may count, so that Redis stays below ``percent`` of its maxmemory.

    What it counts now plus what is free below the line: on a cluster, the fullest primary's
    room times the primaries (tokens spread over them evenly). None: no maxmemory is set.
    """
    nodes, counted = reading
    rooms = [maximum * percent // 100 - used for used, maximum in nodes if maximum > 0]
    if not rooms:
        return None
    return counted + min(rooms) * len(nodes)


class MemoryReserve:
    """The budget's byte limit from Redis's memory, read at most once a second per process.

    ``read`` returns a :data:`MemoryReading` (``INFO memory``, which a script cannot call
    on every Redis, and the budget's count), or None when Redis refuses ``INFO``. Between
    readings the budget's own count, exact and shared by every worker, takes what the
    tokens issued since then add: only memory written by others (consumes, results)
    goes unseen until the next reading. A
    reading that fails keeps the last limit (Redis down fails the generate anyway); one
    Redis refuses (``INFO`` renamed or denied by an ACL) is tried again each minute, and
    said once in the log.
    """

    def __init__(
        self,
        read: Callable[[], MemoryReading | None],
        percent: int,
        interval_seconds: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self.percent = percent
        self.interval_seconds = interval_seconds
        self._clock = clock
        self._due = -math.inf
        self._limit: int | None = None
        self._refused = False

    def byte_limit(self) -> int | None:
        """The most bytes the budget may count now (None: no limit from memory)."""
        if self._clock() >= self._due:
            self._refresh()
        return self._limit

    def _refresh(self) -> None:
        now = self._clock()
        self._due = now + self.interval_seconds  # before the read: one reader at a time per interval
        try:
            reading = self._read()
        except ServiceUnavailable:
            return
        if reading is None:  # a refusal of INFO: no reserve until Redis allows it
            if not self._refused:
                log.warning(
                    "Redis refused INFO memory: the issuance reserve below maxmemory "
                    "(TOKEN_SERVICE_ANONYMOUS_MAX_MEMORY_PERCENT) is off; asking again each minute"
                )
                self._refused = True
            self._due = now + 60.0
            self._limit = None
            return
        self._refused = False
        self._limit = memory_allowance(reading, self.percent)


@functools.lru_cache(maxsize=4096)
def address_group(address: str | None, ipv4_prefix: int = 32, ipv6_prefix: int = 64) -> str:
    """The network a client address is counted as: ``2001:db8:1:2::/64`` for any address of that /64.

    An IPv4 address keeps its text at /32 (``192.0.2.7``); an IPv4-mapped IPv6 address
    (``::ffff:192.0.2.7``, a dual-stack socket's) is that IPv4 address. Anything that is
    not an IP address (a Unix socket's empty peer, None) is counted as its text. Cached:
    generate calls it every time, and a busy client's address repeats.
    """
    if not address:
        return ""
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])  # a zone (fe80::1%eth0) names no network
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    prefix = ipv4_prefix if ip.version == 4 else ipv6_prefix
    if prefix == ip.max_prefixlen:
        return str(ip)
    return str(ipaddress.ip_network((ip, prefix), strict=False))


def client_key(key_prefix: str, identity: str) -> str:
    """The client's limit record: a digest, so no address or subject is stored in clear."""
    raw = hashlib.sha256(identity.encode("utf-8", "surrogateescape")).digest()[:16]
    return f"{key_prefix}{_CLIENT_INFIX}{base64.urlsafe_b64encode(raw).rstrip(b'=').decode('ascii')}"


def client_tag(client_key: str) -> str:
    """What a token counted in this client's outstanding cap carries after its random part.

    '' for a key not made by :func:`client_key` (a test's ``"ts:c:x"``): such a
    client's tokens are never released early, they count until their bucket ends.
    """
    tag = client_key.rpartition(_CLIENT_INFIX)[2]
    return tag if len(tag) == CLIENT_ID_CHARS else ""


def client_key_of(key_prefix: str, token: str) -> str | None:
    """The limit record a token is counted in, or None for a token no cap counts."""
    if len(token) != TOKEN_CHARS + CLIENT_ID_CHARS:
        return None
    return f"{key_prefix}{_CLIENT_INFIX}{token[TOKEN_CHARS:]}"


def parse_limit_record(value: bytes | str) -> tuple[float | None, dict[int, int]]:
    """A client's limit record as lua/admit.lua writes it: (GCRA tat in ms or None, {bucket end s: count})."""
    text_value = value.decode("ascii") if isinstance(value, bytes) else value
    tat, *entries = text_value.split("|")
    buckets = {int(end): int(count) for end, count in (entry.split(":") for entry in entries)}
    return (float(tat) if tat else None), buckets


def admit_reply(reply: list[Any]) -> str:
    """The bucket the tokens are counted in ('' without a cap), or raise the refusal."""
    code = text(reply[0])
    if code == "budget_exhausted":
        seconds = max(1, min(MAX_BUDGET_RETRY_SECONDS, math.ceil(int(reply[1]) / 1000)))
        what = "tokens" if text(reply[2]) == "tokens" else "bytes of Redis memory"
        raise IssuancePaused(
            f"Anonymous issuance is paused: outstanding tokens hold all the {what} they may, "
            f"kept for consumes; retry in {seconds} s.",
            retry_after_seconds=seconds,
        )
    if code == "admitted":
        return text(reply[1])
    if code == "rate_limited":
        seconds = max(1, math.ceil(int(reply[1]) / 1000))
        raise RateLimited(
            f"The issuance rate limit is reached; retry in {seconds} s.", retry_after_seconds=seconds
        )
    if code == "too_many_outstanding":
        seconds = max(1, math.ceil(int(reply[1]) / 1000))
        raise OutstandingCapReached(
            f"Too many of this client's tokens are outstanding; retry in {seconds} s.",
            retry_after_seconds=seconds,
        )
    raise_for(reply)
    raise ValueError(f"unexpected reply from admit: {code!r}")
