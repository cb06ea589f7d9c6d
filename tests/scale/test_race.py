"""The race the service exists for: 200 tokens, 50 contenders each, released together,
through gunicorn, on standalone, Sentinel and Cluster. Exactly one winner per
token; every other contender gets 409 token_used; nothing else.

50 keep-alive connections send their consume of the same token at once (each
with its own request id), wait for all 50 replies, then go on to the next token.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from tests.support.processes import Gunicorn
from tests.support.service import API_KEY
from tests.support.topologies import Topology

pytestmark = [pytest.mark.real, pytest.mark.slow]

TOKENS = 200
CONTENDERS = 50
SCOPE = "payment.create"


@pytest.fixture
def service(topology: Topology) -> Iterator[Gunicorn]:
    env = {
        "TOKEN_SERVICE_REDIS_URL": topology.url,
        "TOKEN_SERVICE_API_KEYS": API_KEY,
        "TOKEN_SERVICE_RATE_LIMIT": "off",
        "TOKEN_SERVICE_MAX_OUTSTANDING_PER_SUBJECT": "0",
    }
    # threads: enough in-flight requests that contenders really meet in Redis
    server = Gunicorn(env, workers=2, extra_args=["--threads", "16", "--access-logfile", "/dev/null"]).start()
    yield server
    server.stop()


class Contender:
    """One keep-alive HTTP/1.1 connection, written raw: 50 of them in one event loop
    cost far less than 50 threads, and a round's requests all leave within a
    millisecond (the write loop never yields), which is the barrier."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, port: int) -> Contender:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def send_consume(self, token: str) -> None:
        body = json.dumps({"token": token, "scope": SCOPE, "request_id": uuid.uuid4().hex}).encode()
        head = (
            "POST /token/consume HTTP/1.1\r\nHost: race\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)

    async def read_reply(self) -> tuple[int, str]:
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        reply = json.loads(await self.reader.readexactly(length))
        return status, "won" if status == 200 else reply.get("code", "")

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


async def race(port: int, tokens: list[str]) -> list[Counter[tuple[int, str]]]:
    contenders = [await Contender.connect(port) for _ in range(CONTENDERS)]
    outcomes: list[Counter[tuple[int, str]]] = []
    try:
        for token in tokens:
            for contender in contenders:
                contender.send_consume(token)
            replies = await asyncio.gather(*(contender.read_reply() for contender in contenders))
            outcomes.append(Counter(replies))
    finally:
        for contender in contenders:
            await contender.close()
    return outcomes


def test_200_tokens_50_contenders_exactly_one_winner_each(service: Gunicorn, topology: Topology) -> None:
    with httpx.Client(base_url=service.url, timeout=30) as http:
        response = http.post("/token/generate/batch", json={"scope": SCOPE, "count": TOKENS})
        assert response.status_code == 201
        tokens = [item["token"] for item in response.json()["tokens"]]

    started = time.monotonic()
    outcomes = asyncio.run(race(service.port, tokens))
    seconds = time.monotonic() - started

    total: Counter[tuple[int, str]] = Counter()
    for per_token in outcomes:
        total.update(per_token)
    winners_per_token = Counter(per_token[(200, "won")] for per_token in outcomes)
    print(
        f"\nFIGURES race[{topology.name}] "
        + json.dumps(
            {
                "tokens": TOKENS,
                "contenders": CONTENDERS,
                "wins": total[(200, "won")],
                "token_used": total[(409, "token_used")],
                "other": sum(n for key, n in total.items() if key not in {(200, "won"), (409, "token_used")}),
                "seconds": round(seconds, 2),
            }
        )
    )
    assert winners_per_token == {1: TOKENS}, winners_per_token
    assert total == {(200, "won"): TOKENS, (409, "token_used"): TOKENS * (CONTENDERS - 1)}, total
