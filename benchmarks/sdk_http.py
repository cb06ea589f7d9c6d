"""SDK consume over HTTP: median latency on the shipped worker model vs sync workers, in one run.

    python -m benchmarks.sdk_http [--rounds 8] [--calls 300] [--out benchmarks]

Two gunicorn servers with the shipped configuration on one private
redis-server: one as shipped (its worker class keeps connections alive), one
forced to sync workers (every reply ``Connection: close``, so every SDK call
opens a new TCP connection -- the service before keep-alive). One
``TokenClient`` per server makes sequential ``consume`` calls; the rounds
alternate the order (A B, B A, ...) and the figure is the median of the
per-round ratios ``shipped / sync`` of median latencies (budget: <= 0.8).
Writes ``sdk_http.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from benchmarks.procs import Gunicorn, RedisServer
from token_service.client import TokenClient

API_KEY = "bench-sdk-key-0123456789"
SCOPE = "bench.sdk"
ENV = {
    "TOKEN_SERVICE_API_KEYS": API_KEY,
    "TOKEN_SERVICE_RATE_LIMIT": "off",
    "TOKEN_SERVICE_MAX_OUTSTANDING_PER_SUBJECT": "0",
    "TOKEN_SERVICE_LOG_LEVEL": "WARNING",
}


def _tokens(url: str, count: int) -> list[str]:
    with httpx.Client(base_url=url, timeout=30) as http:
        reply = http.post("/token/generate/batch", json={"scope": SCOPE, "count": count})
        reply.raise_for_status()
        return [item["token"] for item in reply.json()["tokens"]]


def _median_latency_ms(client: TokenClient, tokens: list[str]) -> float:
    samples = []
    for token in tokens:
        started = time.perf_counter()
        client.consume(token, SCOPE)
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def run(rounds: int, calls: int) -> dict[str, Any]:
    redis_server = RedisServer().start()
    env = {**ENV, "TOKEN_SERVICE_REDIS_URL": redis_server.url}
    servers = {
        "shipped": Gunicorn("token_service:create_app()", env, workers=2).start(),
        "sync": Gunicorn(
            "token_service:create_app()", env, workers=2, extra=["--worker-class", "sync"]
        ).start(),
    }
    clients = {name: TokenClient(server.url, api_key=API_KEY, timeout=10) for name, server in servers.items()}
    per_round: list[dict[str, float]] = []
    try:
        for name, client in clients.items():  # warm up: imports, connections, script cache
            _median_latency_ms(client, _tokens(servers[name].url, 20))
        for index in range(rounds):
            order = ["shipped", "sync"] if index % 2 == 0 else ["sync", "shipped"]
            medians = {}
            for name in order:
                medians[name] = _median_latency_ms(clients[name], _tokens(servers[name].url, calls))
            per_round.append(medians)
    finally:
        for client in clients.values():
            client.close()
        for server in servers.values():
            server.stop()
        redis_server.stop()
    ratios = [r["shipped"] / r["sync"] for r in per_round]
    return {
        "rounds": per_round,
        "shipped_median_ms": statistics.median(r["shipped"] for r in per_round),
        "sync_median_ms": statistics.median(r["sync"] for r in per_round),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "budget": 0.8,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args(argv)
    result = run(args.rounds, args.calls)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sdk_http.json").write_text(json.dumps(result, indent=2) + "\n")
    verdict = "met" if result["ratio"] <= result["budget"] else "NOT met"
    print(
        f"SDK consume over HTTP, median latency: shipped {result['shipped_median_ms']:.3f} ms, "
        f"sync workers {result['sync_median_ms']:.3f} ms, ratio {result['ratio']:.2f} "
        f"(budget <= {result['budget']}: {verdict})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
