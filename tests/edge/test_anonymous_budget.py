"""The anonymous budget: what every client together may hold (lua/admit.lua), and the memory reserve.

A stranger with many addresses is many clients to the per-client limits; the budget
counts them all, in tokens and in bytes, until each token is consumed, begun, revoked
or expires. tests/scale/test_anonymous_fill.py fills a small real Redis through the
service; this file holds the bookkeeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from token_service import create_app
from token_service.errors import IssuancePaused
from token_service.limits import (
    Budget,
    IssuanceLimits,
    MemoryReserve,
    admit_reply,
    budget_key,
    client_key,
    memory_allowance,
    parse_budget_record,
    token_bytes,
)
from token_service.records import IssueRequest
from token_service.store import TokenStore

SCOPE = "payment.create"
AUTH_HEADERS = {"Authorization": "Bearer test-service-key-0123456789"}
BUDGET = budget_key("ts:")
# the largest token generate accepts: 64 characters of scope, 128 four-byte characters of subject
# and of fingerprint (JSON counts characters, not bytes)
LARGEST = {"scope": "s" * 64, "subject": "\U0001f600" * 128, "fingerprint": "\U0001f600" * 128}


def generate(client: Any, addr: str, body: dict[str, Any] | None = None) -> Any:
    return client.post("/token/generate", json=body or {"scope": SCOPE}, environ_base={"REMOTE_ADDR": addr})


def budgeted(make_client: Callable[..., Any], **budget: Any) -> Any:
    # the per-client limits off: the budget alone is under test (each request another address)
    settings = {"anonymous_max_outstanding": "0", "anonymous_max_outstanding_bytes": "0"}
    return make_client(rate_limit="off", max_outstanding_per_subject=0, **{**settings, **budget})


def test_the_budget_counts_every_client_and_refuses_with_503_issuance_paused(
    make_client: Callable[..., Any], redis_client: Any
) -> None:
    client = budgeted(make_client, anonymous_max_outstanding="4")
    assert [generate(client, f"198.51.100.{i}").status_code for i in range(4)] == [201] * 4

    refused = generate(client, "203.0.113.99")  # a client never seen: the budget is everyone's

    assert refused.status_code == 503
    assert refused.mimetype == "application/problem+json"
    assert refused.json["code"] == "issuance_paused"
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert refused.json["retry_after_seconds"] == int(refused.headers["Retry-After"])
    assert parse_budget_record(redis_client.get(BUDGET))[0] == 4  # the refusal charged nothing
    assert len(list(redis_client.scan_iter(match="ts:t:*"))) == 4


@pytest.mark.parametrize("use", ["consume", "begin", "revoke"])
def test_a_used_token_leaves_the_budget(make_client: Callable[..., Any], use: str) -> None:
    client = budgeted(make_client, anonymous_max_outstanding="2")
    tokens = [generate(client, f"198.51.100.{i}").json["token"] for i in range(2)]
    assert generate(client, "198.51.100.9").status_code == 503
    body = {"token": tokens[0]} if use == "revoke" else {"token": tokens[0], "scope": SCOPE}
    assert client.post(f"/token/{use}", json=body, headers=AUTH_HEADERS).status_code == 200
    assert generate(client, "198.51.100.9").status_code == 201
    assert generate(client, "198.51.100.10").status_code == 503


def test_the_budget_counts_bytes_and_a_large_token_costs_more(
    make_client: Callable[..., Any], redis_client: Any
) -> None:
    largest = token_bytes("ts:", LARGEST["scope"], LARGEST["subject"], LARGEST["fingerprint"])
    smallest = token_bytes("ts:", "a", None, None)
    assert largest > 5 * smallest
    client = budgeted(make_client, anonymous_max_outstanding_bytes=str(2 * largest))
    assert generate(client, "198.51.100.1", LARGEST).status_code == 201
    assert generate(client, "198.51.100.2", LARGEST).status_code == 201
    refused = generate(client, "198.51.100.3", LARGEST)
    assert (refused.status_code, refused.json["code"]) == (503, "issuance_paused")
    assert "bytes" in refused.json["detail"]
    assert parse_budget_record(redis_client.get(BUDGET)) == (2, 2 * largest)


def test_a_batch_is_charged_whole_or_not_at_all(make_client: Callable[..., Any], redis_client: Any) -> None:
    client = budgeted(make_client, anonymous_max_outstanding="10")
    batch = {"scope": SCOPE, "count": 8}
    assert client.post("/token/generate/batch", json=batch).status_code == 201
    refused = client.post("/token/generate/batch", json={"scope": SCOPE, "count": 3})
    assert (refused.status_code, refused.json["code"]) == (503, "issuance_paused")
    assert parse_budget_record(redis_client.get(BUDGET))[0] == 8
    assert client.post("/token/generate/batch", json={"scope": SCOPE, "count": 2}).status_code == 201


def test_a_batch_larger_than_the_budget_is_a_400(make_client: Callable[..., Any], redis_client: Any) -> None:
    client = budgeted(make_client, anonymous_max_outstanding="10")
    refused = client.post("/token/generate/batch", json={"scope": SCOPE, "count": 11})
    assert (refused.status_code, refused.json["code"]) == (400, "invalid_request")
    assert "At most 10" in refused.json["errors"]["count"][0]
    assert redis_client.dbsize() == 0


def test_the_clients_own_limits_answer_first(make_client: Callable[..., Any]) -> None:
    # a client over its own rate is told so (429), not that everyone is paused
    client = make_client(rate_limit="1/hour", max_outstanding_per_subject=0, anonymous_max_outstanding="1")
    assert generate(client, "198.51.100.1").status_code == 201
    assert generate(client, "198.51.100.1").json["code"] == "rate_limited"
    assert generate(client, "198.51.100.2").json["code"] == "issuance_paused"


def test_the_budget_is_on_by_default(make_client: Callable[..., Any], redis_client: Any) -> None:
    client = make_client()
    assert generate(client, "198.51.100.1").status_code == 201
    tokens, counted = parse_budget_record(redis_client.get(BUDGET))
    assert tokens == 1
    assert counted == token_bytes("ts:", SCOPE, None, None)


def test_outstanding_tokens_leave_the_budget_when_they_expire(redis_client: Any) -> None:
    now = [1_000_000_000]
    store = TokenStore(redis_client, clock_ms=lambda: now[0])
    limits = IssuanceLimits(None, 0, Budget(max_tokens=3))
    request = IssueRequest(SCOPE, None, None, 10)
    key = client_key("ts:", "addr:198.51.100.1")
    store.admit_and_issue(key, limits, request, 3)
    with pytest.raises(IssuancePaused) as refused:
        store.admit_and_issue(key, limits, request)
    # 10 s tokens count until their 5 s bucket ends: at most 15 s
    assert 1 <= refused.value.retry_after_seconds <= 15
    now[0] += 15_000
    assert len(store.admit_and_issue(key, limits, request, 3)) == 3
    assert parse_budget_record(redis_client.get(BUDGET))[0] == 3  # the ended bucket was dropped


def test_tokens_of_different_lifetimes_each_leave_at_their_own_end(redis_client: Any) -> None:
    now = [1_000_000_000]
    store = TokenStore(redis_client, clock_ms=lambda: now[0])
    limits = IssuanceLimits(None, 0, Budget(max_tokens=100))
    key = client_key("ts:", "addr:198.51.100.1")
    for ttl in (3600, 10, 300, 10, 86400):
        store.admit_and_issue(key, limits, IssueRequest(SCOPE, None, None, ttl))
    record = redis_client.get(BUDGET).decode()
    ends = [int(entry.split(":")[0]) for entry in record.split("|")[1:]]
    assert ends == sorted(ends)  # oldest first
    assert len(ends) == 4  # one bucket per end
    now[0] += 600_000
    store.admit_and_issue(key, limits, IssueRequest(SCOPE, None, None, 10))
    assert parse_budget_record(redis_client.get(BUDGET))[0] == 3  # the 3600 s, the 86400 s, the new one


def test_admit_refuses_bad_budget_arguments_before_writing(redis_client: Any) -> None:
    store = TokenStore(redis_client)
    key = client_key("ts:", "addr:198.51.100.1")
    good = ["1", "0", "1000", "0", "1000", "1000000000"]
    for budget in (["x", "0", "100", "1000"], ["0", "0", "100", ""], ["0", "-1", "100", "1000"]):
        reply = store._call("admit", [key, BUDGET], [*good, *budget])
        assert reply[0] == b"invalid_argument", budget
    assert redis_client.dbsize() == 0


def test_a_budget_refusal_reads_back_as_issuance_paused() -> None:
    with pytest.raises(IssuancePaused) as paused:
        admit_reply([b"budget_exhausted", b"3600000", b"tokens"])
    assert paused.value.retry_after_seconds == 60  # asked again within a minute, whatever the bucket
    assert paused.value.status == 503


def test_the_memory_allowance_is_what_the_line_leaves_free() -> None:
    # 90% of 100 MB is the line; 80 MB used, of which the budget counts 30 MB: it may count 40 MB
    assert memory_allowance(([(80_000_000, 100_000_000)], 30_000_000), 90) == 40_000_000
    assert memory_allowance(([(95_000_000, 100_000_000)], 30_000_000), 90) == 25_000_000
    assert memory_allowance(([(80_000_000, 0)], 30_000_000), 90) is None  # no maxmemory
    # a cluster: the fullest primary's room, for each primary
    assert memory_allowance(([(10, 100), (50, 100)], 0), 90) == 80


def test_the_reserve_reads_once_a_second_and_survives_a_refusal() -> None:
    now = [0.0]
    readings: list[Any] = [([(0, 1000)], 0)]
    calls = []

    def read() -> Any:
        calls.append(now[0])
        return readings[-1]

    reserve = MemoryReserve(read, 90, clock=lambda: now[0])
    assert reserve.byte_limit() == 900
    now[0] = 0.5
    assert reserve.byte_limit() == 900
    assert calls == [0.0]
    readings.append(None)  # INFO refused: no limit from memory, asked again a minute later
    now[0] = 1.0
    assert reserve.byte_limit() is None
    now[0] = 30.0
    assert reserve.byte_limit() is None
    readings.append(([(500, 1000)], 100))
    now[0] = 61.0
    assert reserve.byte_limit() == 500
    assert calls == [0.0, 1.0, 61.0]


def test_the_memory_reading_of_a_real_redis(real_redis: Any) -> None:
    real_redis.config_set("maxmemory", str(64 * 1024 * 1024))
    try:
        store = TokenStore(real_redis)
        limits = IssuanceLimits(None, 0, Budget(max_tokens=10))
        store.admit_and_issue(
            client_key("ts:", "addr:198.51.100.1"), limits, IssueRequest(SCOPE, None, None, 60)
        )
        reading = store.memory_reading()
        assert reading is not None
        (used, maximum), *others = reading[0]
        assert not others
        assert maximum == 64 * 1024 * 1024
        assert 0 < used < maximum
        assert reading[1] == token_bytes("ts:", SCOPE, None, None)
    finally:
        real_redis.config_set("maxmemory", "0")


def test_near_maxmemory_generate_is_refused_and_consume_works(real_redis: Any) -> None:
    app = create_app(
        {
            "redis_client": real_redis,
            "api_keys": "test-service-key-0123456789",
            "rate_limit": "off",
            "max_outstanding_per_subject": 0,
        }
    )
    http = app.test_client()
    kept = generate(http, "198.51.100.1").json["token"]
    used = int(real_redis.info("memory")["used_memory"])
    # the line (90% of maxmemory) just below what Redis holds now: issuance stops, consumes go on
    real_redis.config_set("maxmemory", str(used * 100 // 90 - 1))
    try:
        deadline = time.monotonic() + 30
        refused = generate(http, "198.51.100.2")
        while refused.status_code == 201 and time.monotonic() < deadline:
            time.sleep(0.05)  # the worker's reading is at most a second old
            refused = generate(http, "198.51.100.2")
        assert (refused.status_code, refused.json["code"]) == (503, "issuance_paused")
        consumed = http.post("/token/consume", json={"token": kept, "scope": SCOPE}, headers=AUTH_HEADERS)
        assert consumed.status_code == 200
    finally:
        real_redis.config_set("maxmemory", "0")
