"""Regression: a value holding the record's field separator (\\x1f) is refused by the scripts.

Found while modelling the store: the HTTP API and the SDK refuse control
characters, but TokenStore passed them to Lua, where a request id "a\\x1fb"
shifted the PROCESSING record's fields (the lease id landed where the lease
expiry belongs), so every later consume/begin/inspect failed with a Lua error
and the token was bricked; a won consume's replay with such an id was reported
as a loss; and a token issued for subject "al\\x1fice" was consumed by subject
"al" with fingerprint "ice". The scripts now refuse such values before any write.
"""

from __future__ import annotations

import pytest

from token_service.errors import InvalidRequest
from token_service.records import IssueRequest, UseRequest
from token_service.store import TokenStore

SEP = "\x1f"


def _issue(store: TokenStore, subject: str | None = None) -> str:
    [token] = store.issue(IssueRequest("pay", subject, None, 60))
    return token


def test_issue_refuses_a_separator_in_a_binding(store: TokenStore) -> None:
    for subject, fingerprint in [("al" + SEP + "ice", None), (None, "f" + SEP)]:
        with pytest.raises(InvalidRequest):
            store.issue(IssueRequest("pay", subject, fingerprint, 60))
    assert not store.client.keys(store.key_prefix + "*")


def test_a_separator_in_a_request_id_cannot_brick_a_token(store: TokenStore) -> None:
    token = _issue(store)
    with pytest.raises(InvalidRequest):
        store.begin(UseRequest(token, "pay", request_id="a" + SEP + "b"))
    with pytest.raises(InvalidRequest):
        store.consume(UseRequest(token, "pay", request_id="r" + SEP + "x"))
    assert store.inspect(token).state == "ISSUED"
    assert store.consume(UseRequest(token, "pay", request_id="r")).replayed is False
    assert store.consume(UseRequest(token, "pay", request_id="r")).replayed is True


def test_a_separator_cannot_forge_a_binding(store: TokenStore) -> None:
    token = _issue(store, subject="alice")
    with pytest.raises(InvalidRequest):
        store.consume(UseRequest(token, "pay", subject="alice" + SEP))
    assert store.inspect(token).state == "ISSUED"


def test_complete_and_fail_refuse_a_separator_in_the_lease_id(store: TokenStore) -> None:
    token = _issue(store)
    lease_id = store.begin(UseRequest(token, "pay")).lease_id  # type: ignore[union-attr]
    with pytest.raises(InvalidRequest):
        store.complete(token, lease_id + SEP, {"ok": True})
    with pytest.raises(InvalidRequest):
        store.fail(token, lease_id + SEP, retryable=False)
    assert store.inspect(token).state == "PROCESSING"
    assert store.complete(token, lease_id, {"ok": True}).replayed is False
