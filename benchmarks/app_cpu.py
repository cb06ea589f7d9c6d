"""Application CPU per request, in process: ``python -m benchmarks.app_cpu [--profile TARGET]``.

The HTTP figures include gunicorn, the kernel and wrk, and move with the
machine's load. This measures only what the application itself costs: the
service's and the hand-written baseline's WSGI callables are called directly
(no server, no sockets but the one to Redis) with the bodies wrk sends, A B A B,
and ``time.process_time`` counts this process's CPU per request -- time spent
waiting for redis-server is not counted. Both run as under gunicorn:
Prometheus in multiprocess mode, JSON access lines written (to /dev/null).

``--profile service`` (or ``baseline``) runs cProfile over the last round of
that target and prints the functions with the most own time.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

ENDPOINTS = ("generate", "consume")
Environ = dict[str, Any]


def environ(path: str, body: dict[str, Any], api_key: str | None) -> Environ:
    """A WSGI environ for one POST, as gunicorn builds it for wrk's requests."""
    raw = json.dumps(body).encode()
    env: Environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": path,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "REMOTE_PORT": "40000",
        "HTTP_HOST": "127.0.0.1:8000",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(raw)),
        "wsgi.input": io.BytesIO(raw),
        "wsgi.errors": sys.stderr,
        "wsgi.url_scheme": "http",
        "wsgi.version": (1, 0),
        "wsgi.multithread": False,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    if api_key:
        env["HTTP_AUTHORIZATION"] = f"Bearer {api_key}"
    return env


def serve(app: Callable[..., Iterable[bytes]], environs: list[Environ], expected: str) -> float:
    """CPU microseconds per request of answering every environ; each reply must be ``expected``."""
    statuses: list[str] = []

    def start_response(status: str, headers: Any, exc_info: Any = None) -> None:
        statuses.append(status)

    started = time.process_time()
    for env in environs:
        reply = app(env, start_response)
        b"".join(reply)
        close = getattr(reply, "close", None)
        if close is not None:
            close()
    cpu = time.process_time() - started
    wrong = [s for s in statuses if not s.startswith(expected)]
    if wrong:
        raise RuntimeError(f"expected {expected}, got {wrong[0]} ({len(wrong)} of {len(statuses)})")
    return cpu * 1e6 / len(environs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.app_cpu", description=__doc__)
    parser.add_argument("--requests", type=int, default=3000, help="requests per round (default 3000)")
    parser.add_argument("--rounds", type=int, default=5, help="A B rounds per endpoint (default 5)")
    parser.add_argument("--profile", choices=["service", "baseline"], help="cProfile the last round")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    results = measure(args.requests, args.rounds, args.profile)
    if args.json:
        print(json.dumps(results))
        return 0
    for endpoint, figures in results.items():
        print(
            f"{endpoint}: service {figures['service_us']:.0f} us, baseline {figures['baseline_us']:.0f} us "
            f"of CPU per request; ratio (baseline / service) {figures['ratio']:.2f}"
        )
    return 0


def measure(requests: int, rounds: int, profile: str | None = None) -> dict[str, dict[str, Any]]:
    # As gunicorn_conf does before any worker imports prometheus_client: multiprocess values.
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="ts-bench-metrics-"))
    import cProfile
    import logging.config
    import pstats

    from benchmarks import baseline_app, suite
    from benchmarks.procs import RedisServer
    from token_service import create_app
    from token_service.server.logs import logging_config

    redis_server = RedisServer().start()
    try:
        logging.config.dictConfig(logging_config("INFO"))
        with open(os.devnull, "w") as devnull:
            for handler in logging.getLogger().handlers:
                if isinstance(handler, logging.StreamHandler):
                    handler.setStream(devnull)
            os.environ["BENCH_REDIS_URL"] = redis_server.url
            service = create_app({**suite.SERVICE_ENV, "redis_url": redis_server.url})
            baseline = baseline_app.create_app()
            supply = suite.TokenSupply(redis_server.client())

            def environs(target: str, endpoint: str) -> list[Environ]:
                if endpoint == "generate":
                    return [
                        environ("/token/generate", {"scope": suite.SCOPE, "subject": f"user-{i}"}, None)
                        for i in range(requests)
                    ]
                if target == "service":
                    tokens, key = supply.service_tokens(requests), suite.API_KEY
                else:
                    tokens, key = supply.baseline_tokens(requests), None
                return [environ("/token/consume", {"token": t, "scope": suite.SCOPE}, key) for t in tokens]

            results: dict[str, dict[str, Any]] = {}
            apps = {"service": service, "baseline": baseline}
            for endpoint in ENDPOINTS:
                expected = "201" if endpoint == "generate" else "200"
                for target, app in apps.items():  # warm-up: connections, script caches
                    serve(app, environs(target, endpoint)[:200], expected)
                cpu: dict[str, list[float]] = {target: [] for target in apps}
                for round_number in range(rounds):
                    for target, app in apps.items():
                        batch = environs(target, endpoint)
                        if profile == target and round_number == rounds - 1:
                            profiler = cProfile.Profile()
                            cpu[target].append(profiler.runcall(serve, app, batch, expected))
                            print(f"--- {target} {endpoint}: functions with the most own time")
                            pstats.Stats(profiler).sort_stats("tottime").print_stats(20)
                        else:
                            cpu[target].append(serve(app, batch, expected))
                service_us = statistics.median(cpu["service"])
                baseline_us = statistics.median(cpu["baseline"])
                results[endpoint] = {
                    "service_us": service_us,
                    "baseline_us": baseline_us,
                    "ratio": baseline_us / service_us,
                    "all_service_us": [round(v, 1) for v in cpu["service"]],
                    "all_baseline_us": [round(v, 1) for v in cpu["baseline"]],
                }
            logging.config.dictConfig({"version": 1, "disable_existing_loggers": False})
            return results
    finally:
        redis_server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
