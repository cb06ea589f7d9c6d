"""A batch's tokens and keys (tokens.new_tokens, tokens.record_keys) are the single-token ones."""

from __future__ import annotations

import base64
import secrets

import pytest

from token_service import tokens


def test_each_batch_token_is_32_csprng_bytes_encoded_as_token_urlsafe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drawn: list[bytes] = []
    real = secrets.token_bytes

    def token_bytes(n: int) -> bytes:
        drawn.append(real(n))
        return drawn[-1]

    monkeypatch.setattr(tokens.secrets, "token_bytes", token_bytes)
    batch = tokens.new_tokens(1000)
    assert [len(block) for block in drawn] == [32 * 1000]  # one read, 32 bytes per token
    for i, token in enumerate(batch):
        raw = drawn[0][32 * i : 32 * (i + 1)]
        assert token == base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")  # token_urlsafe's text
        assert len(token) == tokens.TOKEN_CHARS
        assert tokens.is_well_formed(token)
    assert len(set(batch)) == 1000


def test_a_suffix_follows_each_token() -> None:
    batch = tokens.new_tokens(3, "C" * 22)
    assert all(len(token) == tokens.TOKEN_CHARS + 22 and token.endswith("C" * 22) for token in batch)
    assert len({token[: tokens.TOKEN_CHARS] for token in batch}) == 3


def test_batch_keys_are_record_key_of_each_token() -> None:
    batch = [*tokens.new_tokens(50), *tokens.new_tokens(50, "x" * 22), "a-short-test-token"]
    assert tokens.record_keys("ts:", batch) == [tokens.record_key("ts:", token) for token in batch]
    assert tokens.record_keys("other:", batch[:1]) == [tokens.record_key("other:", batch[0])]
