"""Work the hot path does once, not twice: checked by counting calls, not by timing."""

from __future__ import annotations

from typing import Any

from tests.support.service import AUTH


def test_a_consume_digests_its_token_once(client: Any, digests: list[str]) -> None:
    token = client.post("/token/generate", json={"scope": "pay"}).json["token"]
    digests.clear()
    reply = client.post("/token/consume", json={"token": token, "scope": "pay"}, headers=AUTH)
    assert reply.status_code == 200
    assert digests == [token]  # the access log's token_ref and the record key share it
    again = client.post("/token/consume", json={"token": token, "scope": "pay"}, headers=AUTH)
    assert again.status_code == 409  # the key it used was the token's own
