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
"""

from __future__ import annotations

import base64
import functools
import hashlib
import ipaddress
import math
from dataclasses import dataclass
from typing import Any

from token_service.config import RateLimit
from token_service.errors import InvalidRequest, OutstandingCapReached, RateLimited
from token_service.records import raise_for, text
from token_service.tokens import TOKEN_CHARS

# A token counts toward the outstanding cap for at most this long, whatever its TTL:
# the bound on how long a client can be refused by the cap (plus its bucket's rounding,
# at most a quarter of it). A 24 h token held unused stops counting after about an hour.
MAX_COUNTED_SECONDS = 3600
# An id is base64url of 16 digest bytes, unpadded.
CLIENT_ID_CHARS = 22
# "l:" (not the "c:" of the hashes of earlier versions, which expire on their own)
_CLIENT_INFIX = "l:"


@dataclass(frozen=True, slots=True)
class IssuanceLimits:
    rate: RateLimit | None
    max_outstanding: int  # 0: no cap

    @property
    def enabled(self) -> bool:
        return self.rate is not None or self.max_outstanding > 0

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

    def args(self, count: int, ttl_seconds: int, now_ms: str) -> list[str]:
        limit, period_seconds = (self.rate.limit, self.rate.period_seconds) if self.rate else (0, 1)
        return [
            str(count),
            str(limit),
            str(period_seconds * 1000),
            str(self.max_outstanding),
            str(min(ttl_seconds, MAX_COUNTED_SECONDS) * 1000),
            now_ms,
        ]


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
