"""A batch's tokens and keys (tokens.new_tokens) are what new_token and record_key make one at a time."""

from __future__ import annotations

import base64
import secrets

import pytest

from token_service import tokens
from token_service.tokens import whole_number


def test_each_batch_token_is_32_csprng_bytes_encoded_as_token_urlsafe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drawn: list[bytes] = []
    real = secrets.token_bytes

    def token_bytes(n: int) -> bytes:
        drawn.append(real(n))
        return drawn[-1]

    monkeypatch.setattr(tokens.secrets, "token_bytes", token_bytes)
    batch, _ = tokens.new_tokens(1000, "", "ts:")
    assert [len(block) for block in drawn] == [33 * 1000]  # one read: 32 bytes per token, one dropped
    for i, token in enumerate(batch):
        raw = drawn[0][33 * i : 33 * i + 32]
        assert token == base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")  # token_urlsafe's text
        assert len(token) == tokens.TOKEN_CHARS
        assert tokens.is_well_formed(token)
    assert len(set(batch)) == 1000


def test_a_suffix_follows_each_token() -> None:
    batch, _ = tokens.new_tokens(3, "C" * 22, "ts:")
    assert all(len(token) == tokens.TOKEN_CHARS + 22 and token.endswith("C" * 22) for token in batch)
    assert len({token[: tokens.TOKEN_CHARS] for token in batch}) == 3


@pytest.mark.parametrize("count", [1, 3, 4, 200])
@pytest.mark.parametrize(
    ("suffix", "key_prefix"), [("", "ts:"), ("x" * 22, "ts:"), ("x" * 22, "other:"), ("", "")]
)
def test_batch_keys_are_record_key_of_each_token(count: int, suffix: str, key_prefix: str) -> None:
    batch, keys = tokens.new_tokens(count, suffix, key_prefix)
    assert keys == [tokens.record_key(key_prefix, token) for token in batch]
    assert len(set(batch)) == count
    assert all(
        len(token) == tokens.TOKEN_CHARS + len(suffix) and tokens.is_well_formed(token) for token in batch
    )


def test_a_batch_of_one_and_of_none() -> None:
    (token,), (key,) = tokens.new_tokens(1, "", "ts:")
    assert key == tokens.record_key("ts:", token)
    assert tokens.new_tokens(0, "", "ts:") == ([], [])


@pytest.mark.parametrize(
    ("text", "most", "number"),
    [
        ("0", 9, 0),
        ("42", 9, 42),
        ("123456789", 9, 123456789),
        ("1234567890", 9, None),
        ("", 9, None),
        ("²", 9, None),
        ("٣", 9, None),
        ("-1", 9, None),
        (" 1", 9, None),
        ("1e3", 9, None),
        ("9" * 5000, 18, None),
    ],
)
def test_a_whole_number_is_ascii_digits_and_few_of_them(text: str, most: int, number: int | None) -> None:
    assert whole_number(text, max_digits=most) == number
