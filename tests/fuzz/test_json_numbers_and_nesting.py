"""Disagreements and 500s the fuzzing found, pinned down (fakeredis and real Redis)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.service import AUTH


@pytest.mark.parametrize(("ttl", "status"), [(5.0, 201), (5, 201), (5.5, 400), (True, 400), ("5", 400)])
def test_integer_fields_take_json_integers_written_with_a_fraction_of_zero(
    client: Any, ttl: Any, status: int
) -> None:
    # JSON Schema (and so openapi.yaml) calls 5.0 an integer; booleans and strings are not
    response = client.post("/token/generate", json={"scope": "pay", "ttl_seconds": ttl})
    assert response.status_code == status, response.get_json()
    if status == 201:
        assert response.get_json()["ttl_seconds"] == 5
    else:
        assert response.get_json()["errors"]["ttl_seconds"]


def test_count_and_lease_seconds_take_integral_floats(client: Any) -> None:
    batch = client.post("/token/generate/batch", json={"scope": "pay", "count": 2.0})
    assert batch.status_code == 201
    tokens = [item["token"] for item in batch.get_json()["tokens"]]
    assert len(tokens) == 2
    begun = client.post(
        "/token/begin", json={"token": tokens[0], "scope": "pay", "lease_seconds": 7.0}, headers=AUTH
    )
    assert begun.status_code == 200
    assert begun.get_json()["outcome"] == "started"
    refused = client.post(
        "/token/begin", json={"token": tokens[1], "scope": "pay", "lease_seconds": True}, headers=AUTH
    )
    assert refused.status_code == 400


def test_json_nested_deeper_than_the_parser_goes_is_a_400_not_a_500(client: Any) -> None:
    depth = 20000  # 40 KB: inside the body limit, far past Python's recursion limit
    body = '{"scope": "pay", "subject": ' + "[" * depth + "]" * depth + "}"
    response = client.post("/token/generate", data=body, content_type="application/json")
    assert response.status_code == 400
    assert response.get_json()["code"] == "invalid_request"


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_numbers_json_cannot_carry_back_are_refused(client: Any, number: str) -> None:
    # stored as a result they would make every later reply (inspect, begin replay) invalid JSON
    token = client.post("/token/generate", json={"scope": "pay"}).get_json()["token"]
    lease = client.post("/token/begin", json={"token": token, "scope": "pay"}, headers=AUTH).get_json()
    head = json.dumps({"token": token, "lease_id": lease["lease_id"]})[:-1]
    body = f'{head}, "result": {number}}}'
    response = client.post("/token/complete", data=body, content_type="application/json", headers=AUTH)
    assert response.status_code == 400
    assert response.get_json()["code"] == "invalid_request"
    assert (
        client.post("/token/inspect", json={"token": token}, headers=AUTH).get_json()["state"] == "PROCESSING"
    )
