"""The one fingerprint function: requests count by what they mean, not by their bytes."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from token_service.client._fingerprint import (
    RequestFacts,
    body_fingerprint,
    body_identity,
    fields_fingerprint,
    fingerprint,
    fingerprint_request,
    http_fingerprint,
)
from token_service.client.durable import request_fingerprint as durable_fingerprint

JSON = "application/json"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=5)
    ),
    max_leaves=20,
)


def shuffled(value: Any, rng: random.Random) -> Any:
    """The same JSON value with every object's keys in another order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {key: shuffled(item, rng) for key, item in items}
    if isinstance(value, list):
        return [shuffled(item, rng) for item in value]
    return value


@settings(max_examples=200, deadline=None)
@given(document=st.dictionaries(st.text(max_size=6), json_values, max_size=6), seed=st.integers())
def test_key_order_and_whitespace_do_not_change_a_json_fingerprint(
    document: dict[str, Any], seed: int
) -> None:
    rng = random.Random(seed)
    compact = json.dumps(document, separators=(",", ":")).encode()
    spaced = json.dumps(shuffled(document, rng), indent=rng.choice([None, 1, 4]), ensure_ascii=False).encode()
    assert http_fingerprint("POST", "/orders", "", compact, JSON) == http_fingerprint(
        "post", "/orders", "", spaced, "application/json; charset=utf-8"
    )


def test_a_different_value_method_path_or_query_is_a_different_fingerprint() -> None:
    base = http_fingerprint("POST", "/orders", "a=1", b'{"amount": 100}', JSON)
    assert base != http_fingerprint("POST", "/orders", "a=1", b'{"amount": 101}', JSON)
    assert base != http_fingerprint("PATCH", "/orders", "a=1", b'{"amount": 100}', JSON)
    assert base != http_fingerprint("POST", "/order", "a=1", b'{"amount": 100}', JSON)
    assert base != http_fingerprint("POST", "/orders", "a=2", b'{"amount": 100}', JSON)
    # the number 1 and the text "1" are different requests
    assert http_fingerprint("POST", "/", "", b'{"a": 1}', JSON) != http_fingerprint(
        "POST", "/", "", b'{"a": "1"}', JSON
    )


def test_other_bodies_count_by_their_bytes() -> None:
    assert body_identity(b"a=1&b=2", "application/x-www-form-urlencoded") != body_identity(
        b"b=2&a=1", "application/x-www-form-urlencoded"
    )
    # declared JSON that does not parse counts by its bytes, never raises
    assert "sha256" in body_identity(b'{"a": ', JSON)
    assert "sha256" in body_identity(b"[" * 100_000, JSON)
    # JSON not declared as JSON is bytes too: spacing matters then
    assert http_fingerprint("POST", "/", "", b'{"a":1}', "text/plain") != http_fingerprint(
        "POST", "/", "", b'{"a": 1}', "text/plain"
    )
    assert body_identity(b"{}", "application/merge-patch+json") == {"json": {}}


def test_chosen_fields_ignore_the_rest_of_the_body() -> None:
    fields = ("amount", "order.id")
    first = b'{"amount": 100, "order": {"id": "o-1", "note": "first"}, "sent_at": 1}'
    retry = b'{"sent_at": 2, "order": {"note": "again", "id": "o-1"}, "amount": 100}'
    other = b'{"amount": 100, "order": {"id": "o-2"}}'
    assert http_fingerprint("POST", "/", "", first, JSON, fields=fields) == http_fingerprint(
        "POST", "/", "", retry, JSON, fields=fields
    )
    assert http_fingerprint("POST", "/", "", first, JSON, fields=fields) != http_fingerprint(
        "POST", "/", "", other, JSON, fields=fields
    )
    # a missing field is not the same as null
    assert body_identity(b"{}", JSON, ["a"]) != body_identity(b'{"a": null}', JSON, ["a"])
    # form bodies by field too, in any order
    form = "application/x-www-form-urlencoded"
    assert body_identity(b"amount=100&csrf=x", form, ["amount"]) == body_identity(
        b"csrf=y&amount=100", form, ["amount"]
    )
    # and what the issuer computes from the values matches
    assert fingerprint(
        body_identity(b'{"currency": "EUR", "amount": 100}', JSON, ["amount", "currency"])
    ) == (fields_fingerprint({"amount": 100, "currency": "EUR"}))


def test_a_callable_decides_what_counts() -> None:
    facts = RequestFacts("POST", "/orders", "", b"<order id='1'/>", "application/xml", {"x-order": "1"})
    same = RequestFacts("POST", "/orders", "", b"<order id='1' />", "application/xml", {"x-order": "1"})
    assert fingerprint_request(facts, lambda r: r.headers["x-order"]) == fingerprint_request(
        same, lambda r: r.headers["x-order"]
    )
    assert fingerprint_request(facts) != fingerprint_request(same)
    with pytest.raises(TypeError):
        fingerprint_request(facts, "amount")


def test_durable_fingerprints_stored_before_still_match() -> None:
    # the value the durable layer's request_fingerprint gave before it became this function
    parts = ({"amount_cents": 100, "currency": "EUR"}, "order-1", 3)
    expected = "f4a970875dadaaea3039329c34b7a4a5ca96a9aa0ffa3ecc39dcd45ced029652"
    assert durable_fingerprint(*parts) == fingerprint(*parts) == expected
    assert len(http_fingerprint("POST", "/", "", b"")) == 64  # fits every store's fingerprint field


def test_a_deeply_nested_document_never_raises() -> None:
    import sys

    def nested(depth: int) -> str:
        return http_fingerprint("POST", "/", "", b"[" * depth + b"]" * depth, JSON)

    def deep_in_the_stack(frames: int) -> str:
        return nested(990) if frames == 0 else deep_in_the_stack(frames - 1)

    assert len(nested(990)) == 64
    # as if called under a framework's many frames, close to the recursion limit
    assert len(deep_in_the_stack(sys.getrecursionlimit() - 100)) == 64


def test_fields_of_a_body_nested_to_the_limit_never_raise() -> None:
    """The decorators' ``fingerprint=[names]``: a field nested so deep that parsing it fits
    under the recursion limit and encoding it (a few levels deeper) does not was a 500 from
    Django's, FastAPI's and Flask's ``@require_token`` (about 3 depths in a hundred, found by
    scanning). At every depth and stack height: a fingerprint, by the bytes when not by meaning."""
    import sys

    def at_height(frames: int, depth: int) -> str:
        if frames:
            return at_height(frames - 1, depth)
        body = b'{"amount":' + b"[" * depth + b"]" * depth + b',"currency":"EUR"}'
        return body_fingerprint(body, JSON, ["amount", "currency"])

    limit = sys.getrecursionlimit()
    for frames in (0, 50, 200):
        for depth in range(limit - frames - 60, limit - frames + 5):
            assert len(at_height(frames, depth)) == 64
    assert body_fingerprint(b'{"amount": 1, "currency": "EUR"}', JSON, ["amount", "currency"]) == (
        fields_fingerprint({"amount": 1, "currency": "EUR"})
    )
