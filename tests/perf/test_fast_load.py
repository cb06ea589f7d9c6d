"""The schemas' fast path never accepts what marshmallow would refuse, nor loads it differently.

``fast_load`` exists for speed (the hot routes skip marshmallow's machinery
for a valid body); validation must not change. For any body, either the fast
path declines (None) and marshmallow decides, or both accept and agree.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from marshmallow import ValidationError

from token_service.server.schemas import BodySchema, ConsumeSchema, GenerateBatchSchema, GenerateSchema

TTL_LIMITS = {"ttl_seconds": (1, 86400)}
SCHEMAS = {
    "generate": GenerateSchema(limits=TTL_LIMITS),
    "batch": GenerateBatchSchema(limits=TTL_LIMITS),
    "consume": ConsumeSchema(),
}
FIELDS = ["scope", "subject", "ttl_seconds", "fingerprint", "count", "token", "request_id", "Scope", "extra"]

texts = st.one_of(
    st.sampled_from(["payment.create", "a", "9x:y-z_w", "", "-bad", "a b", "x" * 64, "x" * 65, "é", "\x1f"]),
    st.text(max_size=140),
    st.text(alphabet="ab.\x00\x7f\n", max_size=5),
)
values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-2, max_value=90000),
    st.sampled_from([0, 1, 1000, 1001, 86400, 86401]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([5.0, 5.5]),
    texts,
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
bodies = st.dictionaries(st.sampled_from(FIELDS), values, max_size=6)
# mostly well-formed bodies, so that the fast path accepts often and is compared often
likely = st.one_of(
    st.none(),
    st.just("user-1"),
    st.integers(min_value=1, max_value=86400),
    st.sampled_from(["u", "x" * 128, "x" * 129, "a\x1fb", "", 0, 1, 86400, 86401, 1000, 1001, True, 5.0]),
    st.integers(min_value=-1, max_value=90000),
    values,
)
near_valid = st.fixed_dictionaries(
    {
        "scope": st.one_of(st.sampled_from(["payment.create", "a", "Z9:_-."]), texts),
        "token": st.one_of(st.just("t" * 43), texts),
        "count": st.one_of(st.integers(min_value=0, max_value=1001), values),
    },
    optional={name: likely for name in ("subject", "ttl_seconds", "fingerprint", "request_id")},
)


def marshmallow_load(schema: BodySchema, body: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return schema.load(body)  # type: ignore[no-any-return]
    except ValidationError:
        return None


@settings(max_examples=600, deadline=None)
@given(name=st.sampled_from(sorted(SCHEMAS)), body=st.one_of(bodies, near_valid))
def test_fast_path_agrees_with_marshmallow(name: str, body: dict[str, Any]) -> None:
    schema = SCHEMAS[name]
    if name != "consume":
        body.pop("token", None)
    if name != "batch":
        body.pop("count", None)
    fast = schema.fast_load(dict(body))
    if fast is not None:
        assert fast == marshmallow_load(schema, dict(body))


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("generate", {"scope": "payment.create"}),
        ("generate", {"scope": "payment.create", "subject": "user-1", "ttl_seconds": 60, "fingerprint": "o"}),
        ("batch", {"scope": "payment.create", "count": 1000}),
        ("consume", {"token": "t" * 43, "scope": "payment.create"}),
        ("consume", {"token": "t", "scope": "a", "subject": "s", "fingerprint": "f", "request_id": "r"}),
    ],
)
def test_fast_path_takes_the_common_valid_bodies(name: str, body: dict[str, Any]) -> None:
    schema = SCHEMAS[name]
    fast = schema.fast_load(body)
    assert fast is not None
    assert fast == schema.load(body)


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("generate", {"scope": "payment.create", "ttl_seconds": 86401}),
        ("generate", {"scope": "payment.create", "ttl_seconds": True}),
        ("generate", {"scope": "payment.create", "ttl_seconds": 5.0}),  # valid, but marshmallow's call
        ("generate", {"scope": "payment.create", "subject": "a\x1fb"}),
        ("generate", {"scope": "payment.create", "unknown": 1}),
        ("generate", {"scope": None}),
        ("batch", {"scope": "payment.create", "count": 1001}),
        ("consume", {"token": 5, "scope": "payment.create"}),
        ("consume", {"token": "t", "scope": "payment.create", "request_id": ""}),
    ],
)
def test_fast_path_leaves_the_rest_to_marshmallow(name: str, body: dict[str, Any]) -> None:
    assert SCHEMAS[name].fast_load(body) is None


def test_the_batch_reply_is_exactly_what_json_dumps_would_write(client: Any) -> None:
    # generate/batch serialises the shared fields once; the bytes must not change
    reply = client.post(
        "/token/generate/batch",
        json={"scope": "payment.create", "subject": 'user "1" \u00e9', "count": 3, "ttl_seconds": 60},
    )
    assert reply.status_code == 201
    assert reply.mimetype == "application/json"
    assert reply.headers["Cache-Control"] == "no-store"
    body = reply.get_json()
    assert len(body["tokens"]) == 3
    assert reply.get_data(as_text=True) == json.dumps(body, separators=(",", ":"))
    assert {t["subject"] for t in body["tokens"]} == {'user "1" \u00e9'}
    assert len({t["token"] for t in body["tokens"]}) == 3
