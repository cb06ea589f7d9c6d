"""Exactly one winner per token, through gunicorn with several workers, on real Redis."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from tests.support.processes import Gunicorn, RedisServer
from tests.support.service import AUTH, service_env

pytestmark = [pytest.mark.real, pytest.mark.slow]

TOKENS_PER_ROUND = 10
ROUNDS = 5
CONTENDERS = 20


@pytest.fixture
def service(redis_server: RedisServer) -> Iterator[Gunicorn]:
    redis_server.client().flushall()
    server = Gunicorn(service_env(redis_server.url), workers=4).start()
    yield server
    server.stop()


def test_each_token_has_exactly_one_winner_among_20_contenders(service: Gunicorn) -> None:
    threads_count = TOKENS_PER_ROUND * CONTENDERS
    clients = [httpx.Client(base_url=service.url, headers=AUTH, timeout=30) for _ in range(threads_count)]
    barrier = threading.Barrier(threads_count)
    outcomes: Counter[str] = Counter()
    wins_per_token: Counter[str] = Counter()
    lock = threading.Lock()

    def contend(index: int, tokens: list[str]) -> None:
        token = tokens[index % TOKENS_PER_ROUND]
        body = {"token": token, "scope": "payment.create", "request_id": f"contender-{index}"}
        barrier.wait()
        response = clients[index].post("/token/consume", json=body)
        key = (
            "won" if response.status_code == 200 else f"{response.status_code} {response.json().get('code')}"
        )
        with lock:
            outcomes[key] += 1
            if response.status_code == 200:
                assert response.json() == {"outcome": "consumed", "replayed": False}
                wins_per_token[token] += 1

    try:
        for _ in range(ROUNDS):
            issued = clients[0].post(
                "/token/generate/batch", json={"scope": "payment.create", "count": TOKENS_PER_ROUND}
            )
            tokens = [item["token"] for item in issued.json()["tokens"]]
            threads = [threading.Thread(target=contend, args=(i, tokens)) for i in range(threads_count)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
    finally:
        for client in clients:
            client.close()

    total_tokens = TOKENS_PER_ROUND * ROUNDS
    assert len(wins_per_token) == total_tokens
    assert set(wins_per_token.values()) == {1}
    assert outcomes == {"won": total_tokens, "409 token_used": total_tokens * (CONTENDERS - 1)}
