"""The scripts check every argument before their first write: a refused one changes nothing
(no token, no charge to the client's issuance limit)."""

from __future__ import annotations

from typing import Any

import pytest

from token_service import records
from token_service.config import RateLimit
from token_service.errors import InvalidRequest
from token_service.limits import IssuanceLimits
from token_service.records import IssueRequest
from token_service.store import TokenStore

SCOPE = "payment.create"


def test_a_refused_issue_argument_charges_no_limit(redis_client: Any) -> None:
    store = TokenStore(redis_client)
    limits = IssuanceLimits(RateLimit(3, 60), max_outstanding=10)
    for _ in range(4):
        with pytest.raises(InvalidRequest):
            store.admit_and_issue("ts:c:x", limits, IssueRequest(SCOPE, "al\x1fice", None, 60))
    assert redis_client.exists("ts:c:x") == 0
    assert len(store.admit_and_issue("ts:c:x", limits, IssueRequest(SCOPE, "alice", None, 60), 3)) == 3


@pytest.mark.parametrize("bad_ttl", ["1e3", "0x10", "inf", "5.0", " 5", "-5", "0", "1" * 16])
def test_scripts_take_only_plain_decimal_integers(redis_client: Any, bad_ttl: str) -> None:
    store = TokenStore(redis_client)
    reply = store._call("issue", [store.key("B" * 43)], [SCOPE, "", "", bad_ttl])
    assert records.text(reply[0]) == "invalid_argument"
    assert redis_client.dbsize() == 0
