"""renew: the live lease is extended, anything else is refused (store and HTTP route).

The state machine (tests/props/) checks renew against the model in random
sequences; these are the readable cases, plus the HTTP contract.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from tests.test_api import RFC3339_UTC, SCOPE, assert_problem, generate, post
from token_service.errors import InvalidRequest, LeaseLost, TokenInProgress, TokenInvalid
from token_service.records import IssueRequest, UseRequest
from token_service.store import TokenStore

NOW_MS = 1_800_000_000_000


def _store(redis_client: Any, clock: list[int]) -> TokenStore:
    return TokenStore(redis_client, clock_ms=lambda: clock[0])


def _begun(store: TokenStore, lease_seconds: int = 10) -> tuple[str, str]:
    token = store.issue(IssueRequest(SCOPE, None, None, 60))[0]
    started = store.begin(UseRequest(token, SCOPE), lease_seconds=lease_seconds)
    assert not hasattr(started, "result")
    return token, started.lease_id  # type: ignore[union-attr]


def test_renew_extends_the_live_lease_and_keeps_the_record(redis_client: Any) -> None:
    clock = [NOW_MS]
    store = _store(redis_client, clock)
    token, lease_id = _begun(store, lease_seconds=10)
    clock[0] += 8_000
    renewed = store.renew(token, lease_id, lease_seconds=10)
    assert renewed.lease_expires_ms == clock[0] + 10_000
    assert store.inspect(token).lease_expires_ms == clock[0] + 10_000
    # past the first lease's end, the holder still holds it: another begin is refused...
    clock[0] += 5_000
    with pytest.raises(TokenInProgress):
        store.begin(UseRequest(token, SCOPE))
    # ...and its complete is accepted
    assert store.complete(token, lease_id, {"ok": True}).replayed is False


def test_renew_never_shortens_a_lease(redis_client: Any) -> None:
    clock = [NOW_MS]
    store = _store(redis_client, clock)
    token, lease_id = _begun(store, lease_seconds=60)
    assert store.renew(token, lease_id, lease_seconds=1).lease_expires_ms == NOW_MS + 60_000


def test_a_lease_past_its_end_or_taken_over_is_lost_and_unchanged(redis_client: Any) -> None:
    clock = [NOW_MS]
    store = _store(redis_client, clock)
    token, lease_id = _begun(store, lease_seconds=1)
    clock[0] += 1_000  # the lease ends exactly now: fenced, even before anyone took over
    with pytest.raises(LeaseLost):
        store.renew(token, lease_id)
    new = store.begin(UseRequest(token, SCOPE), lease_seconds=5)
    before = redis_client.get(store.key(token))
    with pytest.raises(LeaseLost):
        store.renew(token, lease_id)
    assert redis_client.get(store.key(token)) == before
    assert store.renew(token, new.lease_id, 5).lease_expires_ms == clock[0] + 5_000  # type: ignore[union-attr]


def test_renew_after_complete_consume_or_revoke(redis_client: Any) -> None:
    clock = [NOW_MS]
    store = _store(redis_client, clock)
    token, lease_id = _begun(store)
    store.complete(token, lease_id, 1)
    with pytest.raises(LeaseLost):  # settled: nothing left to renew
        store.renew(token, lease_id)
    consumed = store.issue(IssueRequest(SCOPE, None, None, 60))[0]
    store.consume(UseRequest(consumed, SCOPE))
    with pytest.raises(LeaseLost):
        store.renew(consumed, lease_id)
    store.revoke(token)
    with pytest.raises(TokenInvalid):
        store.renew(token, lease_id)


@pytest.mark.parametrize(("lease_id", "lease_seconds"), [("", 5), ("a\x1fb", 5), ("lease", 0), ("lease", -1)])
def test_bad_arguments_are_refused_before_any_write(
    redis_client: Any, lease_id: str, lease_seconds: int
) -> None:
    clock = [NOW_MS]
    store = _store(redis_client, clock)
    token, _ = _begun(store)
    before = redis_client.get(store.key(token))
    with pytest.raises(InvalidRequest):
        store.renew(token, lease_id, lease_seconds)
    assert redis_client.get(store.key(token)) == before


# -- the HTTP route -----------------------------------------------------------------


def test_http_renew(client: Any) -> None:
    token = generate(client)["token"]
    started = post(client, "/token/begin", {"token": token, "scope": SCOPE, "lease_seconds": 60}).json
    response = post(
        client, "/token/renew", {"token": token, "lease_id": started["lease_id"], "lease_seconds": 600}
    )
    assert response.status_code == 200, response.json
    assert response.json["outcome"] == "renewed"
    assert RFC3339_UTC.match(response.json["lease_expires_at"])
    expires = datetime.fromisoformat(response.json["lease_expires_at"])
    assert 590 < (expires - datetime.now(UTC)).total_seconds() <= 601
    # without lease_seconds: the service's default lease (30 s) from now, never shorter than it was
    again = post(client, "/token/renew", {"token": token, "lease_id": started["lease_id"]})
    assert again.json["lease_expires_at"] == response.json["lease_expires_at"]


def test_http_renew_errors(client: Any) -> None:
    token = generate(client)["token"]
    started = post(client, "/token/begin", {"token": token, "scope": SCOPE}).json
    assert_problem(
        post(client, "/token/renew", {"token": token, "lease_id": "not-the-lease"}), 409, "lease_lost"
    )
    assert_problem(post(client, "/token/renew", {"token": "C" * 43, "lease_id": "x"}), 404, "token_invalid")
    for bad in ({"lease_seconds": 0}, {"lease_seconds": 3601}, {"lease_seconds": "5"}, {"extra": 1}):
        body = {"token": token, "lease_id": started["lease_id"], **bad}
        assert_problem(post(client, "/token/renew", body), 400, "invalid_request")
    assert_problem(post(client, "/token/renew", {"token": token}), 400, "invalid_request")
    assert_problem(
        client.post("/token/renew", json={"token": token, "lease_id": started["lease_id"]}),
        401,
        "unauthorized",
    )
