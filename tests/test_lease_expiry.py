"""A crashed holder's lease runs out in real time: the token is taken over and the old lease fenced."""

from __future__ import annotations

import time
from typing import Any

from tests.support.service import AUTH

SCOPE = "payment.create"
LEASE_SECONDS = 2


def test_a_crashed_holder_is_taken_over_after_its_lease(client: Any) -> None:
    token = client.post("/token/generate", json={"scope": SCOPE}).json["token"]
    # 2 s, not 1 s: the busy check below must land within the lease, and a loaded CI machine can
    # stall this process for most of a second between two requests
    crashed = client.post(
        "/token/begin", json={"token": token, "scope": SCOPE, "lease_seconds": LEASE_SECONDS}, headers=AUTH
    )
    assert crashed.status_code == 200
    busy = client.post("/token/begin", json={"token": token, "scope": SCOPE}, headers=AUTH)
    assert busy.json["code"] == "token_in_progress"

    time.sleep(LEASE_SECONDS + 0.1)  # the holder never comes back
    assert client.post("/token/inspect", json={"token": token}, headers=AUTH).json["state"] == "ISSUED"
    taker = client.post(
        "/token/begin", json={"token": token, "scope": SCOPE, "lease_seconds": 30}, headers=AUTH
    )
    assert taker.json["outcome"] == "started"
    assert taker.json["lease_id"] != crashed.json["lease_id"]

    old = crashed.json["lease_id"]
    late_complete = client.post(
        "/token/complete", json={"token": token, "lease_id": old, "result": 1}, headers=AUTH
    )
    assert (late_complete.status_code, late_complete.json["code"]) == (409, "lease_lost")
    late_fail = client.post(
        "/token/fail", json={"token": token, "lease_id": old, "retryable": True}, headers=AUTH
    )
    assert (late_fail.status_code, late_fail.json["code"]) == (409, "lease_lost")

    done = client.post(
        "/token/complete",
        json={"token": token, "lease_id": taker.json["lease_id"], "result": {"n": 1}},
        headers=AUTH,
    )
    assert done.json == {"outcome": "succeeded", "replayed": False}
    replay = client.post("/token/begin", json={"token": token, "scope": SCOPE}, headers=AUTH)
    assert replay.json == {"outcome": "succeeded", "replayed": True, "result": {"n": 1}}
