"""Work the hot path does once, not twice: checked by counting calls, not by timing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.service import AUTH
from token_service import store, tokens


@pytest.fixture
def digests(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every token_digest computed, wherever it is called from."""
    seen: list[str] = []
    real = tokens.token_digest

    def counting(token: str) -> str:
        seen.append(token)
        return real(token)

    monkeypatch.setattr(tokens, "token_digest", counting)
    monkeypatch.setattr(store, "token_digest", counting)
    return seen


def test_a_consume_digests_its_token_once(client: Any, digests: list[str]) -> None:
    token = client.post("/token/generate", json={"scope": "pay"}).json["token"]
    digests.clear()
    reply = client.post("/token/consume", json={"token": token, "scope": "pay"}, headers=AUTH)
    assert reply.status_code == 200
    assert digests == [token]  # the access log's token_ref and the record key share it
    again = client.post("/token/consume", json={"token": token, "scope": "pay"}, headers=AUTH)
    assert again.status_code == 409  # the key it used was the token's own
