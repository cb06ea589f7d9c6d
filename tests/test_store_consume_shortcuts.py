"""The shortcuts on the store's consume path answer exactly what the long way did.

consume runs once per token, so its key, its text check and its reply have
fast paths (token_service/tokens.py, records.py). Each is held here to the
plain definition it replaces.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from token_service import records
from token_service.errors import InvalidRequest, TokenInvalid, TokenMismatch, TokenUsed
from token_service.records import Consumed
from token_service.tokens import NO_CONTROL_RE, is_plain_text, is_well_formed, record_key, token_digest

TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{16,128}\Z")
# what tokens, ids and scopes are made of, and the characters around the rules' edges
ALPHABET = st.sampled_from(
    [*"azAZ09-_.:~ \t\n\r\x00\x1f\x7f\x80\xe9\u200b\ud800\udfff", "\U0001f600", "\uff10", "\u0661"]
)


def reference_digest(token: str) -> str:
    raw = hashlib.sha256(token.encode("ascii")).digest()[:16]
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def test_token_digest_is_the_unpadded_base64url_of_the_first_128_bits_of_sha256() -> None:
    assert token_digest("A" * 43) == reference_digest("A" * 43)
    for _ in range(2000):
        token = secrets.token_urlsafe(32)
        assert token_digest(token) == reference_digest(token)
        assert record_key("ts:", token) == f"ts:t:{reference_digest(token)}"
    with pytest.raises(UnicodeEncodeError):
        token_digest("é" * 20)


# no deadline: hypothesis's 200 ms per example is a speed check a loaded CI machine fails
@settings(deadline=None)
@given(st.text(ALPHABET, max_size=140) | st.text(max_size=140))
def test_is_well_formed_answers_as_the_token_regex(value: str) -> None:
    assert is_well_formed(value) == bool(TOKEN_RE.match(value))


@pytest.mark.parametrize(
    "value", ["-" * 16, "_" * 128, "a" * 15, "a" * 129, "a" * 16 + "\n", "\u0660" * 16, "\uff10" * 16]
)
def test_is_well_formed_edges(value: str) -> None:
    assert is_well_formed(value) == bool(TOKEN_RE.match(value))


@settings(deadline=None)
@given(st.text(ALPHABET, max_size=40) | st.text(max_size=40))
def test_is_plain_text_answers_as_the_no_control_regex(value: str) -> None:
    assert is_plain_text(value) == (NO_CONTROL_RE.match(value) is not None)


@pytest.mark.parametrize("code", [b"consumed", "consumed"])
def test_consume_reply_reads_both_answers(code: Any) -> None:
    assert records.consume_reply([code, 0]) == Consumed(replayed=False)
    assert records.consume_reply([code, 1]) == Consumed(replayed=True)
    assert records.consume_reply([code, b"1"]) == Consumed(replayed=True)


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ([b"token_invalid"], TokenInvalid),
        (["token_used"], TokenUsed),
        ([b"token_mismatch", b"subject"], TokenMismatch),
        ([b"invalid_argument", b"ARGV[1] must not contain the field separator"], InvalidRequest),
    ],
)
def test_consume_reply_still_raises_what_the_script_reported(
    reply: list[Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        records.consume_reply(reply)
