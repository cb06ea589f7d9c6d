"""A page of the admin walk holds at most ``limit`` records and reads no more than it needs.

Issue 26: ``GET /admin/records?limit=1&count=10000`` over 5,000 stored results
returned all 5,000 (81 MB in one reply): the page kept every record of the SCAN
call's batch. Now a page stops reading when it is full and its cursor resumes
mid-batch; a full walk with small pages lists every record exactly once when
nothing changes, and at least once whatever changes meanwhile.
"""

from __future__ import annotations

import json
import secrets
from collections import Counter
from typing import Any

import pytest

from token_service import create_app
from token_service.errors import InvalidRequest
from token_service.ops.admin import TOKEN, Admin, Filter

from .test_admin_api import ADMIN, ADMIN_KEY

SEP = "\x1f"


def _store_results(client: Any, count: int, result_bytes: int = 64, prefix: str = "ts:") -> set[str]:
    """``count`` SUCCEEDED token records (each with a result of about ``result_bytes``), by ref."""
    result = json.dumps({"blob": "x" * result_bytes})
    refs = {secrets.token_urlsafe(16)[:22] for _ in range(count)}
    pipe = client.pipeline(transaction=False)
    for ref in refs:
        pipe.set(f"{prefix}t:{ref}", "S" + SEP.join(["pay", "", "", "", "", "", "", result]), px=600_000)
    pipe.execute()
    # Let Redis finish growing its hash table, or "nothing changes" is not true: while a table
    # is rehashed, one SCAN cursor covers other keys from one call to the next, and the walk
    # reads the batch again (at least once, not exactly once). Each key lookup moves the rehash
    # on by one bucket or more, and a table that grew while these keys were written has fewer
    # buckets left to move than there are keys (no waiting on the server's own timer).
    for _ in range(2):
        pipe = client.pipeline(transaction=False)
        for ref in refs:
            pipe.exists(f"{prefix}t:{ref}")
        pipe.execute()
    return refs


def _walk(admin: Admin, wanted: Filter, count: int, limit: int) -> list[str]:
    seen, cursor = [], "0"
    while True:
        page = admin.list(wanted, cursor, count=count, limit=limit)
        assert len(page.records) <= limit
        seen += [record.ref for record in page.records]
        if page.done:
            return seen
        cursor = page.cursor


def test_a_page_holds_at_most_limit_records_and_reads_no_more(redis_any: Any) -> None:
    _store_results(redis_any, 600)
    for limit in (1, 5, 100):
        admin = Admin(redis_any, actor="test")
        page = admin.list(Filter(), "0", count=10000, limit=limit)
        assert len(page.records) == limit  # was 600: the whole SCAN batch
        # reading stopped when the page was full: the records fetched are the page's
        assert admin.records_read == limit
        assert not page.done


def test_a_page_with_a_filter_reads_a_bounded_number_of_records(redis_any: Any, store: Any) -> None:
    from token_service.records import IssueRequest

    _store_results(redis_any, 600)
    tokens = store.issue(IssueRequest("refund", None, None, 600), 3)
    admin = Admin(redis_any, actor="test")
    page = admin.list(Filter(state="ISSUED"), "0", count=10000, limit=1)
    assert len(page.records) <= 1
    # what a page reads beyond its need grows 16, 64, 256, ... up to MAX_READ per read
    assert admin.records_read <= 1 + 16 + 64 + 256 + Admin.MAX_READ
    assert sorted(_walk(admin, Filter(state="ISSUED"), 10000, 1)) == sorted(
        record.ref for record in (admin.show(_ref(token)) for token in tokens)
    )


def _ref(token: str) -> str:
    from token_service.tokens import token_digest

    return token_digest(token)


@pytest.mark.parametrize(("count", "limit"), [(10000, 1), (10000, 7), (10, 3), (1, 1), (50, 1000)])
def test_a_walk_in_small_pages_lists_every_record_exactly_once(
    redis_any: Any, count: int, limit: int
) -> None:
    refs = _store_results(redis_any, 300)
    admin = Admin(redis_any, actor="test")
    seen = Counter(_walk(admin, Filter(kind=TOKEN), count, limit))
    assert set(seen) == refs
    assert max(seen.values()) == 1


# slow: stores 500 records and walks them page by page while some go (24 s on a cluster, loaded)
@pytest.mark.slow
def test_records_present_for_the_whole_walk_are_listed_even_when_the_keyspace_changes(redis_any: Any) -> None:
    kept = _store_results(redis_any, 400)
    doomed = _store_results(redis_any, 100)
    admin = Admin(redis_any, actor="test")
    seen: list[str] = []
    cursor, pages = "0", 0
    while True:
        page = admin.list(Filter(kind=TOKEN), cursor, count=10000, limit=3)
        seen += [record.ref for record in page.records]
        pages += 1
        if pages == 2:
            # mid-batch: keys deleted, and enough written that the hash table grows (rehashes)
            pipe = redis_any.pipeline(transaction=False)
            for ref in doomed:
                pipe.delete(f"ts:t:{ref}")
            pipe.execute()
            _store_results(redis_any, 3000)
        if page.done:
            break
        cursor = page.cursor
    assert kept <= set(seen)


def test_a_cursor_is_strictly_parsed(redis_any: Any) -> None:
    _store_results(redis_any, 20)
    admin = Admin(redis_any, actor="test")
    mid = admin.list(Filter(), "0", count=10000, limit=1).cursor
    node, position, skip, count, batch = mid.split(".")
    assert (skip, count, len(batch)) == ("1", "10000", 16)
    for bad in (
        f"{node}.{position}.0.{count}.{batch}",  # no keys read: no batch
        f"{node}.{position}.{skip}.{batch}",
        f"{node}.{position}.{skip}.{count}",
        f"{node}.{position}.{skip}.{count}.{batch.upper()}",
        f"{node}.{position}.{skip}.{count}.{batch}0",
        f"{node}.{position}.{skip}.{count}.{batch}.1",
        f"{node}.{position}.{skip}.10001.{batch}",
        f"{node}.{position}.{skip}.0.{batch}",
        f"{node}.{position}.123456.{count}.{batch}",
        f"{node}.{position}.01.{count}.{batch}",
        f"{node}.{position}.².{count}.{batch}",
    ):
        with pytest.raises(InvalidRequest):
            admin.list(Filter(), bad)
    # a well-formed cursor of another batch is read from that batch's start: nothing is skipped
    for other in (f"{node}.{position}.{skip}.{count}.{'0' * 16}", f"{node}.{position}.99999.{count}.{batch}"):
        assert len(admin.list(Filter(), other, count=10000, limit=100).records) == 20


def test_the_next_page_may_ask_another_count(redis_any: Any) -> None:
    # the batch a page stopped in is asked for again with its own count, so nothing is listed twice
    refs = _store_results(redis_any, 60)
    admin = Admin(redis_any, actor="test")
    seen, cursor, counts = [], "0", iter([7, 1000, 3, 10000, 1] * 100)
    while True:
        page = admin.list(Filter(kind=TOKEN), cursor, count=next(counts), limit=4)
        seen += [record.ref for record in page.records]
        if page.done:
            break
        cursor = page.cursor
    assert sorted(seen) == sorted(refs)


def test_over_http_limit_1_count_10000_is_one_record(redis_any: Any) -> None:
    _store_results(redis_any, 2000, result_bytes=16_000)
    http = create_app({"admin_keys": ADMIN_KEY, "redis_client": redis_any, "rate_limit": "off"}).test_client()
    reply = http.get("/admin/records?limit=1&count=10000", headers=ADMIN)
    assert reply.status_code == 200
    assert len(reply.json["records"]) == 1
    assert len(reply.data) < 40_000  # one record of 16 KB, not 32 MB
    refs, cursor = [], reply.json["cursor"]
    refs += [record["ref"] for record in reply.json["records"]]
    while cursor != "0":
        page = http.get(f"/admin/records?limit=500&count=10000&cursor={cursor}", headers=ADMIN).json
        assert len(page["records"]) <= 500
        refs += [record["ref"] for record in page["records"]]
        cursor = page["cursor"]
    assert len(refs) == len(set(refs)) == 2000
    prefixed = http.get(f"/admin/records?ref_prefix={refs[0][:6]}&limit=1&count=10000", headers=ADMIN)
    assert len(prefixed.json["records"]) == 1
