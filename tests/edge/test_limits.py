"""Issuance limits: the per-client rate limit and the cap on outstanding tokens (lua/admit.lua)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.processes import free_port
from token_service import create_app
from token_service.config import RateLimit
from token_service.errors import InvalidRequest, RateLimited
from token_service.limits import (
    IssuanceLimits,
    OutstandingCapReached,
    address_group,
    admit_reply,
    client_key,
)
from token_service.store import TokenStore

GENERATE = {"scope": "payment.create"}


def token_keys(redis_client: Any) -> int:
    return len(list(redis_client.scan_iter(match="ts:t:*", count=1000)))


def generate(
    client: Any, body: dict[str, Any] | None = None, addr: str = "203.0.113.7", **headers: str
) -> Any:
    return client.post(
        "/token/generate", json=body or GENERATE, headers=headers, environ_base={"REMOTE_ADDR": addr}
    )


def test_rate_limit_hit_answers_429_with_retry_after_and_issues_nothing(
    make_client: Callable[..., Any], redis_client: Any
) -> None:
    client = make_client(rate_limit="3/minute", max_outstanding_per_subject=0)
    assert [generate(client).status_code for _ in range(3)] == [201, 201, 201]
    assert token_keys(redis_client) == 3

    refused = generate(client)

    assert refused.status_code == 429
    assert refused.mimetype == "application/problem+json"
    assert refused.json["code"] == "rate_limited"
    # 3/minute: one token's worth of credit comes back every 20 s
    assert 1 <= int(refused.headers["Retry-After"]) <= 20
    assert token_keys(redis_client) == 3


def test_batch_counts_each_token(make_client: Callable[..., Any], redis_client: Any) -> None:
    client = make_client(rate_limit="10/minute", max_outstanding_per_subject=0)
    batch = {**GENERATE, "count": 8}
    assert client.post("/token/generate/batch", json=batch).status_code == 201
    assert client.post("/token/generate/batch", json={**GENERATE, "count": 3}).status_code == 429
    assert client.post("/token/generate/batch", json={**GENERATE, "count": 2}).status_code == 201
    assert generate(client, addr="127.0.0.1").status_code == 429
    assert token_keys(redis_client) == 10


def test_a_batch_over_a_limit_is_a_400_on_count_not_a_429(
    make_client: Callable[..., Any], redis_client: Any
) -> None:
    # issue 33: it was 429 with Retry-After: 60, a wait after which the same batch fails again
    client = make_client(rate_limit="10/minute", max_outstanding_per_subject=5)
    too_fast = client.post("/token/generate/batch", json={**GENERATE, "count": 11})
    too_many = client.post("/token/generate/batch", json={**GENERATE, "count": 6})
    assert (too_fast.status_code, too_many.status_code) == (400, 400)
    assert too_fast.json["code"] == too_many.json["code"] == "invalid_request"
    assert "Retry-After" not in too_fast.headers
    assert "Retry-After" not in too_many.headers
    assert "at most 10" in too_fast.json["detail"]
    assert "at most 5" in too_many.json["detail"]
    assert too_fast.json["errors"] == {
        "count": ["At most 10: the issuance rate limit (TOKEN_SERVICE_RATE_LIMIT)."]
    }
    assert list(too_many.json["errors"]) == ["count"]
    assert too_many.json["errors"]["count"][0].startswith("At most 5: ")
    # refused before Redis: nothing issued, nothing charged
    assert redis_client.dbsize() == 0
    assert client.post("/token/generate/batch", json={**GENERATE, "count": 5}).status_code == 201


def test_outstanding_cap(make_client: Callable[..., Any], redis_client: Any) -> None:
    client = make_client(rate_limit="off", max_outstanding_per_subject=3)
    body = {**GENERATE, "ttl_seconds": 60}
    assert [generate(client, body).status_code for _ in range(3)] == [201, 201, 201]

    refused = generate(client, body)

    assert refused.status_code == 429
    assert refused.json["code"] == "rate_limited"
    # room comes back when the oldest token's bucket ends: its ttl, rounded up by at most ttl/4 (20 s buckets)
    assert 59 <= int(refused.headers["Retry-After"]) <= 80
    assert token_keys(redis_client) == 3
    # another client is not affected
    assert generate(client, body, addr="198.51.100.1").status_code == 201


def test_limits_are_per_client_address(make_client: Callable[..., Any]) -> None:
    client = make_client(rate_limit="1/hour")
    assert generate(client, addr="192.0.2.1").status_code == 201
    assert generate(client, addr="192.0.2.1").status_code == 429
    assert generate(client, addr="192.0.2.2").status_code == 201


@pytest.mark.parametrize(
    ("address", "group"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("2001:db8:1:2::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),  # the same /64: the same client
        ("2001:DB8:1:2:0:0:0:9", "2001:db8:1:2::/64"),  # however it is written
        ("2001:db8:1:3::1", "2001:db8:1:3::/64"),  # the next /64: another client
        ("::ffff:192.0.2.7", "192.0.2.7"),  # a dual-stack socket's IPv4 peer is that IPv4 address
        ("fe80::1%eth0", "fe80::/64"),
        ("", ""),
        (None, ""),
        ("unix:/run/x.sock", "unix:/run/x.sock"),  # not an address: counted as its text
    ],
)
def test_a_client_address_is_counted_as_its_network(address: str | None, group: str) -> None:
    assert address_group(address) == group


def test_the_networks_are_configurable() -> None:
    assert address_group("192.0.2.7", 24, 64) == "192.0.2.0/24"
    assert address_group("2001:db8:1:2::1", 32, 48) == "2001:db8:1::/48"
    assert address_group("2001:db8:1:2::1", 32, 128) == "2001:db8:1:2::1"


def test_the_addresses_of_one_ipv6_slash_64_are_one_client(make_client: Callable[..., Any]) -> None:
    client = make_client(rate_limit="2/hour")
    # an IPv6 host is handed a /64: 2^64 addresses, each of which used to be a client of its own
    assert generate(client, addr="2001:db8:7:7::1").status_code == 201
    assert generate(client, addr="2001:db8:7:7::2").status_code == 201
    refused = generate(client, addr="2001:db8:7:7:dead:beef:0:1")
    assert (refused.status_code, refused.json["code"]) == (429, "rate_limited")
    assert generate(client, addr="2001:db8:7:8::1").status_code == 201  # the next /64 is another client


def test_ipv4_clients_can_be_grouped_by_network(make_client: Callable[..., Any]) -> None:
    client = make_client(rate_limit="1/hour", client_ipv4_prefix="24")
    assert generate(client, addr="198.51.100.1").status_code == 201
    assert generate(client, addr="198.51.100.200").status_code == 429
    assert generate(client, addr="198.51.101.1").status_code == 201


def test_spoofed_forwarded_for_is_ignored_without_trusted_proxies(make_client: Callable[..., Any]) -> None:
    client = make_client(rate_limit="1/hour", trusted_proxy_hops=0)
    assert generate(client, **{"X-Forwarded-For": "10.0.0.1"}).status_code == 201
    # a fresh X-Forwarded-For does not make a fresh client
    again = generate(client, **{"X-Forwarded-For": "10.0.0.2"})
    assert again.status_code == 429


def test_only_the_trusted_hops_of_forwarded_for_count(make_client: Callable[..., Any]) -> None:
    client = make_client(rate_limit="1/hour", trusted_proxy_hops=1)
    # our one proxy appends the address it saw; what the client wrote before it is ignored
    assert generate(client, **{"X-Forwarded-For": "6.6.6.6, 192.0.2.10"}).status_code == 201
    spoofed = generate(client, **{"X-Forwarded-For": "7.7.7.7, 192.0.2.10"})
    assert spoofed.status_code == 429
    assert generate(client, **{"X-Forwarded-For": "192.0.2.11"}).status_code == 201


def test_subject_header_mode_rejects_a_body_subject(make_client: Callable[..., Any]) -> None:
    client = make_client(subject_header="X-Authenticated-User", rate_limit="off")
    rejected = generate(client, {**GENERATE, "subject": "mallory"}, **{"X-Authenticated-User": "alice"})
    assert rejected.status_code == 400
    assert rejected.json["code"] == "invalid_request"
    assert "subject" in rejected.json["errors"]

    issued = generate(client, **{"X-Authenticated-User": "alice"})
    assert issued.status_code == 201
    assert issued.json["subject"] == "alice"


def test_a_malformed_gateway_subject_is_a_400(make_client: Callable[..., Any]) -> None:
    client = make_client(subject_header="X-Authenticated-User", rate_limit="off")
    response = generate(client, **{"X-Authenticated-User": "a" * 129})
    assert response.status_code == 400
    assert response.json["code"] == "invalid_request"


def test_with_a_trusted_subject_the_limit_follows_the_subject(make_client: Callable[..., Any]) -> None:
    client = make_client(subject_header="X-Authenticated-User", rate_limit="1/hour")
    assert generate(client, addr="192.0.2.1", **{"X-Authenticated-User": "alice"}).status_code == 201
    # alice from another address is still alice
    assert generate(client, addr="192.0.2.2", **{"X-Authenticated-User": "alice"}).status_code == 429
    # bob behind the same address (a shared NAT) has his own budget
    assert generate(client, addr="192.0.2.1", **{"X-Authenticated-User": "bob"}).status_code == 201


def test_the_limit_record_holds_no_address_in_clear(
    make_client: Callable[..., Any], redis_client: Any
) -> None:
    client = make_client(rate_limit="5/minute")
    assert generate(client, addr="192.0.2.99").status_code == 201
    keys = [key.decode() for key in redis_client.scan_iter(match="ts:{l}:*") if key != b"ts:{l}:anonymous"]
    assert keys == [client_key("ts:", "addr:192.0.2.99")]
    assert "192.0.2.99" not in keys[0]
    assert redis_client.pttl(keys[0]) > 0  # limit records expire on their own


def test_store_unreachable_during_admission_fails_closed() -> None:
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    client = create_app({"redis_client": dead, "rate_limit": "5/minute"}).test_client()
    response = generate(client)
    assert response.status_code == 503
    assert response.json["code"] == "store_unavailable"
    dead.close()


class Clock:
    def __init__(self) -> None:
        self.ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.ms


def test_rate_credit_comes_back_over_time(redis_client: Any) -> None:
    clock = Clock()
    store = TokenStore(redis_client, clock_ms=clock)
    limits = IssuanceLimits(RateLimit(2, 1), max_outstanding=0)
    store.admit("ts:c:x", limits, 2, 60)
    with pytest.raises(RateLimited) as refused:
        store.admit("ts:c:x", limits, 1, 60)
    assert refused.value.retry_after_seconds == 1  # 500 ms, rounded up
    clock.ms += 499
    with pytest.raises(RateLimited):
        store.admit("ts:c:x", limits, 1, 60)
    clock.ms += 1
    store.admit("ts:c:x", limits, 1, 60)


@pytest.mark.parametrize(("limit", "period_seconds"), [(50_000, 10), (25_000, 10), (7, 60)])
def test_a_rate_above_one_per_millisecond_keeps_its_whole_burst_and_pace(
    redis_client: Any, limit: int, period_seconds: int
) -> None:
    # the limiter's state is kept to the microsecond: rounded to whole milliseconds, every
    # call moved it on by 1 ms at least, and 5000/second let 1000 through, then 1 a ms.
    # The record expires in Redis's real time while this test's clock stands still: with the
    # rate alone it would be kept a millisecond after a first single call, and a loaded
    # machine, slower than that between two calls, would find it gone and let more through.
    # An outstanding cap it never reaches keeps the record for its bucket (a minute at
    # least), and the burst is a batch then 20 single calls (each 0.2-0.4 ms of the period).
    clock = Clock()
    store = TokenStore(redis_client, clock_ms=clock)
    limits = IssuanceLimits(RateLimit(limit, period_seconds), max_outstanding=3 * limit)
    client = f"ts:c:pace-{limit}"
    singles = min(limit, 20)

    def burst() -> None:  # one whole period's worth, at one instant
        if limit > singles:
            store.admit(client, limits, limit - singles, 60)
        for _ in range(singles):
            store.admit(client, limits, 1, 60)
        with pytest.raises(RateLimited):
            store.admit(client, limits, 1, 60)

    burst()
    clock.ms += period_seconds * 1000  # a whole period later: the whole burst again
    burst()


def test_outstanding_tokens_stop_counting_when_they_expire(redis_client: Any) -> None:
    clock = Clock()
    store = TokenStore(redis_client, clock_ms=clock)
    limits = IssuanceLimits(None, max_outstanding=2)
    store.admit("ts:c:y", limits, 2, 10)
    with pytest.raises(OutstandingCapReached) as refused:
        store.admit("ts:c:y", limits, 1, 10)
    assert refused.value.code == "rate_limited"
    # expiry is counted at the end of its bucket (5 s wide for a 10 s ttl): 10 to 15 s from now
    assert 10 <= refused.value.retry_after_seconds <= 15
    clock.ms += refused.value.retry_after_seconds * 1000 - 1000
    with pytest.raises(OutstandingCapReached):
        store.admit("ts:c:y", limits, 1, 10)
    clock.ms += 1000
    store.admit("ts:c:y", limits, 2, 10)
    # the expired bucket was dropped: the new one is all that is left
    assert redis_client.get("ts:c:y") == f"|{-(-(clock.ms + 10_000) // 5000) * 5}:2".encode()


def test_admit_refuses_bad_arguments_before_writing(redis_client: Any) -> None:
    store = TokenStore(redis_client)
    with pytest.raises(InvalidRequest):
        admit_reply(store._scripts["admit"](keys=["ts:c:z"], args=["0", "1", "1000", "0", "1000", ""]))
    # the script's own guard, behind the store's check that says it in words
    too_big = ["3", "2", "1000", "0", "60000", ""]
    with pytest.raises(InvalidRequest):
        admit_reply(store._scripts["admit"](keys=["ts:c:z"], args=too_big))
    with pytest.raises(InvalidRequest) as never:
        store.admit("ts:c:z", IssuanceLimits(RateLimit(2, 1), 0), 3, 60)
    assert list(never.value.errors) == ["count"]
    assert redis_client.exists("ts:c:z") == 0
