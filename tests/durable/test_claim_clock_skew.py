"""The durable claim asks the database's clock, not the app server's, whether a lease ran out.

Issue 24's case: on PostgreSQL a claim committed with a 5 s lease was taken
over a second later by a second process whose wall clock ran 10 s ahead (the
card network would have been charged twice). Here the second process runs
under ``faketime`` (:mod:`tests.support.skew`): 10 s ahead it must find the
claim in progress for as long as the lease lasts; 10 s behind it must take
the claim over once the lease has ended, not 10 s later. SQLite has no clock
of its own (a file read by this host's), so only the servers are shifted
against; tests/durable's other tests run the claim on all three.
"""

from __future__ import annotations

import time

import pytest

from tests.durable.databases import Db
from tests.support.skew import Skewed
from token_service.client.durable import Claim, claim

# slow: processes under faketime wait out a 5 s lease (~20 s)
pytestmark = pytest.mark.slow

LEASE_SECONDS = 5


# SQLite has no clock of its own to share
@pytest.mark.parametrize("db", ["postgresql", "mariadb"], indirect=True)
def test_a_host_whose_clock_is_off_neither_takes_a_live_lease_nor_waits_out_a_dead_one(db: Db) -> None:
    key = "pay-skew"
    args = {"url": db.url, "table": db.records.name, "key": key, "lease_seconds": LEASE_SECONDS}
    ahead, behind = Skewed(+10, "durable_claim", args), Skewed(-10, "durable_claim", args)
    try:
        for child in (ahead, behind):
            child.check_shifted()
            assert child.read() == {"ready": True}

        before_claim = time.monotonic()
        with db.engine.begin() as conn:
            first = claim(conn, key, lease_seconds=LEASE_SECONDS, table=db.records)
        claimed = time.monotonic()
        assert isinstance(first, Claim)

        ahead.send(go=True)
        early = ahead.finish()
        seen_seconds = time.monotonic() - before_claim
        # the only acceptable takeover is one after the lease ended (a machine stalled that long)
        assert early["outcome"] == "in_progress" or seen_seconds >= LEASE_SECONDS, early
        if early["outcome"] != "in_progress":
            return  # stalled past the lease: the rest would test the stall, not the clocks
        assert 1 <= early["retry_after_seconds"] <= LEASE_SECONDS

        time.sleep(max(0.0, claimed + LEASE_SECONDS + 0.5 - time.monotonic()))
        behind.send(go=True)
        late = behind.finish()
        assert late == {"outcome": "claimed", "taken_over": True}
    finally:
        ahead.kill()
        behind.kill()
    record = db.record(key)
    assert record is not None
    assert record.lease_id != first.lease_id
