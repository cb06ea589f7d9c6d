"""SDK consume over HTTP: median latency on the shipped worker model vs sync workers, in one run.

    python -m benchmarks.sdk_http [--rounds 8] [--calls 300] [--schemes http,https] [--out benchmarks]

Per scheme, two gunicorn servers with the shipped configuration on one
private redis-server: one as shipped (its worker class keeps connections
alive), one forced to sync workers (every reply ``Connection: close``, so
every SDK call opens a new TCP connection -- the service before keep-alive).

- ``http``: plain HTTP on loopback, where a new TCP connection costs little.
- ``https``: gunicorn's own TLS (``--certfile``/``--keyfile``) with a
  self-signed ECDSA P-256 certificate made for the run by the ``openssl``
  CLI, which the client trusts through ``httpx.HTTPTransport(verify=...)``.
  On sync workers every call is a new TCP connection and a full TLS
  handshake (the SDK keeps no TLS sessions), as in production before
  keep-alive.

One ``TokenClient`` per server makes sequential ``consume`` calls; the rounds
alternate the order (A B, B A, ...) and a scheme's figure is the median of
the per-round ratios ``shipped / sync`` of median latencies (budget: <= 0.8).
Writes ``sdk_http.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import ssl
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from benchmarks.procs import Gunicorn, RedisServer, require
from token_service.client import TokenClient

API_KEY = "bench-sdk-key-0123456789"
SCOPE = "bench.sdk"
ENV = {
    "TOKEN_SERVICE_API_KEYS": API_KEY,
    "TOKEN_SERVICE_RATE_LIMIT": "off",
    "TOKEN_SERVICE_MAX_OUTSTANDING_PER_SUBJECT": "0",
    "TOKEN_SERVICE_LOG_LEVEL": "WARNING",
}
SCHEMES = ("http", "https")
WORKERS = ("shipped", "sync")
_BATCH_MAX = 1000  # the API's largest generate batch


class SelfSignedCertificate:
    """A key and certificate for 127.0.0.1, valid one day, in a temporary directory."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ts-bench-tls-"))
        self.certfile = self.dir / "cert.pem"
        self.keyfile = self.dir / "key.pem"

    def create(self) -> SelfSignedCertificate:
        openssl = require("openssl", "apt-get install openssl")
        subprocess.run(
            [
                openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                "-addext", "subjectAltName=IP:127.0.0.1",
                "-keyout", str(self.keyfile), "-out", str(self.certfile),
            ],
            check=True,
            capture_output=True,
        )  # fmt: skip
        return self

    def client_context(self) -> ssl.SSLContext:
        """Verifies the server against this certificate only (hostname checked too)."""
        return ssl.create_default_context(cafile=str(self.certfile))

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class TlsGunicorn(Gunicorn):
    """:class:`Gunicorn` serving HTTPS with gunicorn's own ``--certfile``/``--keyfile``."""

    def __init__(
        self,
        app: str,
        env: dict[str, str],
        workers: int,
        cert: SelfSignedCertificate,
        extra: Sequence[str] = (),
    ) -> None:
        super().__init__(
            app,
            env,
            workers,
            extra=[*extra, "--certfile", str(cert.certfile), "--keyfile", str(cert.keyfile)],
        )
        self.context = cert.client_context()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def healthy(self) -> bool:
        return httpx.get(self.url + "/healthz", verify=self.context, timeout=1).status_code == 200


def _tokens(url: str, count: int, verify: ssl.SSLContext | bool = True) -> list[str]:
    tokens: list[str] = []
    with httpx.Client(base_url=url, timeout=30, verify=verify) as http:
        while len(tokens) < count:
            batch = min(_BATCH_MAX, count - len(tokens))
            reply = http.post("/token/generate/batch", json={"scope": SCOPE, "count": batch})
            reply.raise_for_status()
            tokens += [item["token"] for item in reply.json()["tokens"]]
    return tokens


def _median_latency_ms(client: TokenClient, tokens: list[str]) -> float:
    samples = []
    for token in tokens:
        started = time.perf_counter()
        client.consume(token, SCOPE)
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def _summary(per_round: list[dict[str, float]], budget: float) -> dict[str, Any]:
    ratios = [r["shipped"] / r["sync"] for r in per_round]
    return {
        "rounds": per_round,
        "shipped_median_ms": statistics.median(r["shipped"] for r in per_round),
        "sync_median_ms": statistics.median(r["sync"] for r in per_round),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "budget": budget,
    }


def run(rounds: int, calls: int, schemes: Sequence[str] = SCHEMES) -> dict[str, Any]:
    redis_server = RedisServer().start()
    cert = SelfSignedCertificate().create() if "https" in schemes else None
    env = {**ENV, "TOKEN_SERVICE_REDIS_URL": redis_server.url}
    app = "token_service:create_app()"
    sync = ["--worker-class", "sync"]
    servers: dict[tuple[str, str], Gunicorn] = {}
    clients: dict[tuple[str, str], TokenClient] = {}
    verify: dict[str, ssl.SSLContext | bool] = {"http": True}
    per_round: dict[str, list[dict[str, float]]] = {scheme: [] for scheme in schemes}
    try:
        for scheme in schemes:
            for workers in WORKERS:
                extra = sync if workers == "sync" else []
                if scheme == "https":
                    assert cert is not None
                    server: Gunicorn = TlsGunicorn(app, env, 2, cert, extra=extra).start()
                    verify["https"] = cert.client_context()
                    # the SDK's own option: an httpx transport that trusts the run's certificate
                    transport = httpx.HTTPTransport(verify=verify["https"])
                    client = TokenClient(server.url, api_key=API_KEY, timeout=10, transport=transport)
                else:
                    server = Gunicorn(app, env, 2, extra=extra).start()
                    client = TokenClient(server.url, api_key=API_KEY, timeout=10)
                servers[scheme, workers] = server
                clients[scheme, workers] = client
        for (scheme, workers), client in clients.items():  # warm up: imports, connections, script cache
            _median_latency_ms(client, _tokens(servers[scheme, workers].url, 20, verify[scheme]))
        for index in range(rounds):
            scheme_order = list(schemes) if index % 2 == 0 else list(reversed(schemes))
            for scheme in scheme_order:
                order = list(WORKERS) if index % 2 == 0 else list(reversed(WORKERS))
                medians = {}
                for workers in order:
                    url = servers[scheme, workers].url
                    tokens = _tokens(url, calls, verify[scheme])
                    medians[workers] = _median_latency_ms(clients[scheme, workers], tokens)
                per_round[scheme].append(medians)
    finally:
        for client in clients.values():
            client.close()
        for server in servers.values():
            server.stop()
        redis_server.stop()
        if cert is not None:
            cert.remove()
    budget = 0.8
    return {
        "schemes": {scheme: _summary(per_round[scheme], budget) for scheme in schemes},
        "budget": budget,
        "load_average": os.getloadavg(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--schemes", default=",".join(SCHEMES), help="comma-separated: http, https")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args(argv)
    schemes = [s for s in args.schemes.split(",") if s]
    unknown = set(schemes) - set(SCHEMES)
    if unknown or not schemes:
        parser.error(f"--schemes takes http and/or https, not {args.schemes!r}")
    result = run(args.rounds, args.calls, schemes)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sdk_http.json").write_text(json.dumps(result, indent=2) + "\n")
    for scheme, figures in result["schemes"].items():
        verdict = "met" if figures["ratio"] <= figures["budget"] else "NOT met"
        print(
            f"SDK consume over {scheme}, median latency: shipped {figures['shipped_median_ms']:.3f} ms, "
            f"sync workers {figures['sync_median_ms']:.3f} ms, ratio {figures['ratio']:.2f} "
            f"(budget <= {figures['budget']}: {verdict})"
        )
    load = result["load_average"]
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
