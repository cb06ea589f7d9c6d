"""Request bodies that once got a 500: each is now refused as 400 invalid_request (or, where it
could be stored, answered by the store), never a 500."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.service import AUTH
from token_service import records
from token_service.errors import InvalidRequest

SCOPE = "payment.create"


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/token/generate", "subject"),
        ("/token/generate", "fingerprint"),
        ("/token/consume", "request_id"),
        ("/token/complete", "lease_id"),
    ],
)
def test_a_lone_surrogate_is_400_not_500(client: Any, path: str, field: str) -> None:
    body: dict[str, Any] = {"scope": SCOPE} if path == "/token/generate" else {"token": "A" * 43}
    if path == "/token/consume":
        body["scope"] = SCOPE
    body[field] = "ok\ud800"
    raw = json.dumps(body)  # ensure_ascii writes the surrogate as the escape \ud800
    response = client.post(path, data=raw, headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 400, response.data
    assert field in response.json["errors"]


def test_results_nested_near_the_recursion_limit_are_never_500(client: Any) -> None:
    token = client.post("/token/generate", json={"scope": SCOPE}).json["token"]
    client.post("/token/begin", json={"token": token, "scope": SCOPE}, headers=AUTH)
    seen = set()
    for depth in [*range(60, 70), *range(900, 1100)]:  # around the cap, and around Python's limit
        # the wrong lease makes every storable result a 409 from the store, and nothing is stored
        nested = "[" * depth + "]" * depth
        raw = f'{{"token": "{token}", "lease_id": "not-the-lease", "result": {nested}}}'
        response = client.post(
            "/token/complete", data=raw, headers={**AUTH, "Content-Type": "application/json"}
        )
        assert response.status_code in (400, 409), (depth, response.data)
        seen.add(response.status_code)
    assert seen == {400, 409}  # the range spans both sides of the limit


@pytest.mark.parametrize("value", [float("nan"), float("inf"), object()])
def test_payloads_that_cannot_be_stored_are_invalid_requests(value: Any) -> None:
    with pytest.raises(InvalidRequest):
        records.check_payload("result", value, 1000)
