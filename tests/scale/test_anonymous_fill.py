"""Strangers cannot take what paying users need: a small Redis filled through anonymous generate.

A real ``redis-server`` with a small ``maxmemory`` and ``noeviction``, the service under
gunicorn, and a flood of the largest tokens generate accepts (a 64-character scope, 128
four-byte characters of subject and of fingerprint, a 24-hour TTL) from a few hundred
loopback addresses, each its own client to the per-client limits (the service sees the
real peer: no proxy, no forwarded header). Before the anonymous budget and the memory
reserve, 135 addresses filled a 12 MB Redis in 11 s and every consume then answered 503
(``OOM``) for as long as the tokens lived. Now issuance is refused (503
``issuance_paused``) before Redis is full, and the consumes, begins and completes of the
tokens issued before the flood all succeed.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support import raw_http
from tests.support.processes import Gunicorn, RedisServer
from tests.support.service import API_KEY

pytestmark = [pytest.mark.real, pytest.mark.slow]

MAXMEMORY_BYTES = 16 * 1024 * 1024
SCOPE = "payment.create"
# the largest token generate accepts
LARGEST = {
    "scope": "s" * 64,
    "subject": "\U0001f600" * 128,
    "fingerprint": "\U0001f600" * 128,
    "ttl_seconds": 86400,
}
BURST = 60  # the default rate limit's burst (60/minute), under the default cap of 100
STRANGERS = [f"127.0.{2 + i // 250}.{1 + i % 250}" for i in range(500)]  # up to 42 MB of tokens


@pytest.fixture
def small_redis() -> Iterator[RedisServer]:
    server = RedisServer("--maxmemory", str(MAXMEMORY_BYTES), "--maxmemory-policy", "noeviction").start()
    yield server
    server.stop()


@pytest.fixture
def service(small_redis: RedisServer) -> Iterator[Gunicorn]:
    # every limit at its default: the deployment as an operator would start it
    env = {"TOKEN_SERVICE_REDIS_URL": small_redis.url, "TOKEN_SERVICE_API_KEYS": API_KEY}
    server = Gunicorn(env, workers=2).start()
    yield server
    server.stop()


def post(sock: object, path: str, body: dict[str, object], key: bool = False) -> raw_http.Reply:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {API_KEY}"
    raw = json.dumps(body).encode()
    sock.sendall(raw_http.request_bytes("POST", path, raw, headers))  # type: ignore[attr-defined]
    return raw_http.read_reply(sock)  # type: ignore[arg-type]


def flood_from(address: tuple[str, int], source: str) -> str:
    """One stranger's burst of the largest tokens, in one batch; what the service answered."""
    with raw_http.connect(address, source=source, timeout=60) as sock:
        reply = post(sock, "/token/generate/batch", {**LARGEST, "count": BURST})
    return reply.json().get("code", "issued") if reply.status != 201 else "issued"


def test_strangers_filling_redis_leave_room_for_paying_consumes(
    small_redis: RedisServer, service: Gunicorn
) -> None:
    address = ("127.0.0.1", service.port)
    redis_client = small_redis.client()
    with raw_http.connect(address, source="127.0.0.1") as sock:
        # a shop's tokens, issued before the flood: the ones paying customers will use
        paying = [post(sock, "/token/generate", {"scope": SCOPE, "ttl_seconds": 3600}) for _ in range(20)]
        assert [reply.status for reply in paying] == [201] * 20
    tokens = [reply.json()["token"] for reply in paying]

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        answers = Counter(pool.map(lambda source: flood_from(address, source), STRANGERS))
    flood_seconds = time.monotonic() - started
    memory = redis_client.info("memory")
    print(  # the figures of the note (pytest -s)
        f"flood: {dict(answers)} in {flood_seconds:.1f} s; used_memory {memory['used_memory']} "
        f"of {MAXMEMORY_BYTES}; {redis_client.dbsize()} keys"
    )

    # and every paying customer's token still works: one-shot consumes, and two-phase runs
    with raw_http.connect(address, source="127.0.0.1") as sock:
        consumed = [
            post(sock, "/token/consume", {"token": token, "scope": SCOPE, "request_id": f"r-{i}"}, key=True)
            for i, token in enumerate(tokens[:15])
        ]
        begun = [
            post(sock, "/token/begin", {"token": token, "scope": SCOPE, "request_id": f"b-{i}"}, key=True)
            for i, token in enumerate(tokens[15:])
        ]
        completed = [
            post(
                sock,
                "/token/complete",
                {"token": token, "lease_id": reply.json()["lease_id"], "result": {"order": "x" * 4000}},
                key=True,
            )
            for token, reply in zip(tokens[15:], begun, strict=True)
            if reply.status == 200
        ]

    print(
        f"consumes: {Counter(reply.status for reply in consumed)}, begins: {Counter(r.status for r in begun)}"
    )
    assert [reply.status for reply in consumed] == [200] * 15, [reply.body[:120] for reply in consumed]
    assert [reply.status for reply in begun] == [200] * 5, [reply.body[:120] for reply in begun]
    assert [reply.status for reply in completed] == [200] * 5
    # a new stranger's burst: still refused (what the paying tokens freed is not room for it), and told why
    with raw_http.connect(address, source="127.0.9.9") as sock:
        again = post(sock, "/token/generate/batch", {**LARGEST, "count": BURST})
    assert (again.status, again.json()["code"]) == (503, "issuance_paused")
    assert 1 <= int(again.headers["retry-after"]) <= 60
    # the strangers were stopped by the budget's memory reserve, not by Redis running out
    assert answers["issuance_paused"] > 0, answers
    assert set(answers) <= {"issued", "issuance_paused"}, answers
    assert memory["used_memory"] < MAXMEMORY_BYTES
