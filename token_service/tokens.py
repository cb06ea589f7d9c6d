"""Token values, their digests, and the Redis keys derived from them.

A token is ``secrets.token_urlsafe(32)``: 256 bits from the OS CSPRNG, 43
URL-safe characters. Redis only ever sees a digest: the record key is built
from the first 128 bits of SHA-256(token), base64url-encoded. SHA-256 is
enough here (no HMAC pepper) because the token itself carries 256 random
bits: there is nothing to brute-force from a dump. Lookup by digest also means
no token is ever compared byte by byte in Python, so there is no timing
side channel to guard.
"""

from __future__ import annotations

import binascii
import hashlib
import os
import re
import secrets

__all__ = [
    "MAX_TOKEN_CHARS",
    "NO_CONTROL_RE",
    "SCOPE_RE",
    "SCOPE_RULE",
    "TOKEN_BYTES",
    "TOKEN_CHARS",
    "digest_key",
    "is_plain_text",
    "is_well_formed",
    "new_lease_id",
    "new_request_id",
    "new_token",
    "new_tokens",
    "record_key",
    "token_digest",
    "whole_number",
]

TOKEN_BYTES = 32
# secrets.token_urlsafe(TOKEN_BYTES): a token issued under an outstanding cap has its
# client's id after these (token_service.limits)
TOKEN_CHARS = 43
MAX_TOKEN_CHARS = 128
# Anything that could be one of our tokens (or a longer one a future version
# issues); other strings are rejected before they reach Redis.
_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{16,128}\Z")
_KEY_DIGEST_BYTES = 16

# Field rules shared by the API's schemas and the SDK's direct transport (which has no
# marshmallow). Subjects, fingerprints and request ids are opaque text but never control
# characters: the Redis record separates its fields with \x1f.
SCOPE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}\Z")
SCOPE_RULE = "1-64 chars of A-Za-z0-9._:- starting with a letter or digit"
# Lone surrogates (possible in JSON as "\\ud800") are no text either: they cannot be
# encoded for Redis, so they are refused with the control characters.
NO_CONTROL_RE = re.compile(r"[^\x00-\x1f\x7f\ud800-\udfff]*\Z")


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def new_lease_id() -> str:
    """``secrets.token_urlsafe(16)``'s text, without its four Python calls (one per begin)."""
    return _b2a_base64(_urandom(16), newline=False)[:22].translate(_URLSAFE).decode("ascii")


def new_request_id() -> str:
    """Identifies one logical request across its retries (and one HTTP request in the logs)."""
    # 128 random bits, as uuid4().hex but a quarter of its cost; secrets.token_hex(16) is this
    return _urandom(16).hex()


def is_well_formed(token: str) -> bool:
    return bool(_TOKEN_RE.match(token))


def is_plain_text(value: str) -> bool:
    """True when ``value`` has no control characters and no lone surrogates (NO_CONTROL_RE)."""
    # printable ASCII (0x20-0x7e) passes without the regex
    return (value.isascii() and value.isprintable()) or NO_CONTROL_RE.match(value) is not None


def whole_number(text: str, max_digits: int = 18) -> int | None:
    """``text`` as a whole number (>= 0) when it is one, else None: ASCII digits only ("²" is
    a digit to str.isdigit() and an error to int()), at most ``max_digits`` of them (int()
    refuses a string of over 4300). For numbers read from headers, query strings and argv."""
    if 0 < len(text) <= max_digits and text.isascii() and text.isdigit():
        return int(text)
    return None


_sha256 = hashlib.sha256
_urandom = os.urandom  # what secrets draws from (secrets.token_bytes is os.urandom)
_b2a_base64 = binascii.b2a_base64
_URLSAFE = bytes.maketrans(b"+/", b"-_")
# base64 of the 16-byte digest without its "==" padding
_DIGEST_CHARS = 22
# new_tokens: a token's bytes and a zero byte, and their base64 characters
_TOKEN_SPAN_BYTES = TOKEN_BYTES + 1
_TOKEN_SPAN_CHARS = _TOKEN_SPAN_BYTES // 3 * 4
# below this many, new_tokens makes them one by one (measured: about where the two cost the same)
_FEW_TOKENS = 4
# and a digest's bytes and two zero bytes
_DIGEST_SPAN_CHARS = (_KEY_DIGEST_BYTES + 2) // 3 * 4


def token_digest(token: str) -> str:
    """Short, non-reversible identity of a token: safe for keys, logs and database rows.

    base64url of the first 128 bits of SHA-256, unpadded: what
    ``base64.urlsafe_b64encode(raw).rstrip(b"=")`` gives, without its two extra calls
    (it runs on every token operation).
    """
    raw = _sha256(token.encode("ascii")).digest()[:_KEY_DIGEST_BYTES]
    return _b2a_base64(raw, newline=False)[:_DIGEST_CHARS].translate(_URLSAFE).decode("ascii")


def record_key(key_prefix: str, token: str) -> str:
    return f"{key_prefix}t:{token_digest(token)}"  # digest_key, inlined: once per token operation


def new_tokens(count: int, suffix: str, key_prefix: str) -> tuple[list[str], list[str]]:
    """``count`` new tokens, each followed by ``suffix``, and their record keys.

    Each token is :func:`new_token`'s text of its own 32 bytes of
    ``secrets.token_bytes``, all drawn in one read; each key is the one
    :func:`record_key` gives. A batch of 1000 made token by token spends most of
    its CPU in per-token calls (1000 ``urandom`` reads, encodings and
    decodings), so both are encoded in one base64 call each instead: base64
    turns every 3 bytes into 4 characters on their own, so a token's 32 bytes
    and one zero byte (33: 44 characters) encode to its 43 characters of
    ``token_urlsafe`` (which pads the last one with the same zero bits) and
    one to drop, and a 16-byte digest and two zero bytes (18: 24 characters) to
    its 22 characters and two to drop. The 33rd byte of each draw is zeroed,
    never used.
    """
    if count == 1:  # generate's one
        token = new_token() + suffix
        return [token], [record_key(key_prefix, token)]
    if count < _FEW_TOKENS:  # the per-token functions cost less than the set-up below
        tokens = [new_token() + suffix for _ in range(count)]
        return tokens, [record_key(key_prefix, token) for token in tokens]
    raw = bytearray(secrets.token_bytes(_TOKEN_SPAN_BYTES * count))
    raw[TOKEN_BYTES::_TOKEN_SPAN_BYTES] = bytes(count)
    encoded = _b2a_base64(raw, newline=False).translate(_URLSAFE)
    starts = range(0, _TOKEN_SPAN_CHARS * count, _TOKEN_SPAN_CHARS)
    tag, sha256 = suffix.encode("ascii"), _sha256
    digests = (
        b"\0\0".join(
            [sha256(encoded[at : at + TOKEN_CHARS] + tag).digest()[:_KEY_DIGEST_BYTES] for at in starts]
        )
        + b"\0\0"
    )
    text = encoded.decode("ascii")
    tokens = [text[at : at + TOKEN_CHARS] + suffix for at in starts]
    digest_text = _b2a_base64(digests, newline=False).translate(_URLSAFE).decode("ascii")
    prefix = f"{key_prefix}t:"
    keys = [
        prefix + digest_text[at : at + _DIGEST_CHARS]
        for at in range(0, _DIGEST_SPAN_CHARS * count, _DIGEST_SPAN_CHARS)
    ]
    return tokens, keys


def digest_key(key_prefix: str, digest: str) -> str:
    """The record key of the token with this :func:`token_digest`."""
    return f"{key_prefix}t:{digest}"
