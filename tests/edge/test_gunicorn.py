"""The service under gunicorn and granian with several workers: metrics, JSON logs, draining, config
errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.processes import (
    REPO_ROOT,
    SERVERS,
    Granian,
    Gunicorn,
    RedisServer,
    free_port,
    wait_until,
)
from tests.support.service import API_KEY
from token_service.config import Settings
from token_service.server.granian_serve import exposure_refused

pytestmark = [pytest.mark.real, pytest.mark.slow]

ROUNDS = 40  # each round: generate, then consume the token
SCOPE = "gunicorn.test"


def counter(metrics_text: str, name: str, **labels: str) -> float:
    """One sample's value from the Prometheus text format (0 when absent)."""
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    for line in metrics_text.splitlines():
        if line.startswith(name + "{"):
            series, _, value = line.rpartition(" ")
            have = ",".join(sorted(series[len(name) + 1 : -1].split(",")))
            if have == wanted:
                return float(value)
    return 0.0


@pytest.fixture(scope="module", params=sorted(SERVERS))
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Gunicorn, Path]]:
    redis_server = RedisServer().start()
    metrics_dir = tmp_path_factory.mktemp("metrics")
    (metrics_dir / "counter_999999.db").write_bytes(b"stale samples of an earlier run")
    server = SERVERS[request.param](
        {
            "TOKEN_SERVICE_REDIS_URL": redis_server.url,
            "TOKEN_SERVICE_API_KEYS": API_KEY,
            "TOKEN_SERVICE_RATE_LIMIT": "off",
            "TOKEN_SERVICE_METRIC_SCOPES": SCOPE,  # its issuance counted under its name from the first
            "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        },
        workers=2,
    ).start()
    yield server, metrics_dir
    server.stop()
    redis_server.stop()


def one_round(url: str) -> tuple[str, list[str]]:
    # a new connection each time, so the kernel spreads them over both workers
    with httpx.Client(base_url=url, timeout=10) as http:
        issued = http.post("/token/generate", json={"scope": SCOPE})
        assert issued.status_code == 201
        token = issued.json()["token"]
        consumed = http.post(
            "/token/consume",
            json={"token": token, "scope": SCOPE},
            headers={"Authorization": f"Bearer {API_KEY}"},
        )
        assert consumed.status_code == 200
        return token, [issued.headers["X-Request-ID"], consumed.headers["X-Request-ID"]]


def drive(url: str, rounds: int) -> tuple[list[str], list[str]]:
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda _: one_round(url), range(rounds)))
    return [token for token, _ in results], [rid for _, ids in results for rid in ids]


def scrape(url: str) -> str:
    response = httpx.get(url + "/metrics", timeout=10)
    assert response.status_code == 200
    return response.text


def test_metrics_count_every_request_once_across_workers(service: tuple[Gunicorn, Path]) -> None:
    server, metrics_dir = service
    assert server.process is not None
    drive(server.url, ROUNDS)

    # both workers served traffic: each keeps its own sample files
    assert len({path.name for path in metrics_dir.glob("counter_*.db")}) >= 2
    assert not (metrics_dir / "counter_999999.db").exists(), "stale samples must be cleaned at start"
    # any worker answers the scrape with the same, complete totals
    for _ in range(4):
        text = scrape(server.url)
        assert counter(text, "token_service_tokens_issued_total", scope=SCOPE) == ROUNDS
        generated = dict(method="POST", route="/token/generate", status="201")
        assert counter(text, "token_service_http_requests_total", **generated) == ROUNDS
        consumed = dict(method="POST", route="/token/consume", status="200")
        assert counter(text, "token_service_http_requests_total", **consumed) == ROUNDS
        outcome = dict(operation="consume", code="consumed", scope=SCOPE)
        assert counter(text, "token_service_token_outcomes_total", **outcome) == ROUNDS
        latency = dict(method="POST", route="/token/consume")
        assert counter(text, "token_service_http_request_duration_seconds_count", **latency) == ROUNDS

    # a worker killed outright: its counts stay, its replacement counts on
    victim = min(server.worker_pids())
    os.kill(victim, signal.SIGKILL)
    wait_until(
        lambda: len(server.worker_pids() - {victim}) == 2,  # type: ignore[union-attr]
        what="a replacement worker",
    )
    drive(server.url, 5)
    text = scrape(server.url)
    assert counter(text, "token_service_tokens_issued_total", scope=SCOPE) == ROUNDS + 5


def test_log_lines_are_json_with_request_ids_and_no_tokens(service: tuple[Gunicorn, Path]) -> None:
    server, _ = service
    tokens, request_ids = drive(server.url, 10)

    def logged() -> tuple[list[str], list[dict[str, Any]]] | None:
        lines = [line for line in server.log().splitlines() if line.strip()]
        records = [json.loads(line) for line in lines]  # every line is one JSON object
        access = [r for r in records if r.get("logger") == "token_service.access"]
        return (lines, records) if set(request_ids) <= {r["request_id"] for r in access} else None

    # a worker may write its access line after the client has its reply (a fixed 0.2 s was too short
    # on a loaded machine)
    lines, records = wait_until(logged, what="every request's access line")
    access = [r for r in records if r.get("logger") == "token_service.access"]
    assert all({"method", "route", "status", "duration_ms"} <= set(r) for r in access)
    # the server's own messages are JSON too
    assert any(r.get("logger") in ("gunicorn.error", "_granian") for r in records)
    if isinstance(server, Granian):
        # what it relies on the proxy for, said once at start (docs/deployment.md)
        warned = [r for r in records if "relies on the proxy in front" in r.get("message", "")]
        assert [r["level"] for r in warned] == ["WARNING"]
    log_text = "\n".join(lines)
    for token in tokens:
        assert token not in log_text
        assert token[:16] not in log_text


DRAIN_SECONDS = 8


@pytest.mark.parametrize("kind", sorted(SERVERS))
def test_readiness_fails_while_draining_then_the_server_stops(kind: str) -> None:
    redis_server = RedisServer().start()
    server = SERVERS[kind](
        {
            "TOKEN_SERVICE_REDIS_URL": redis_server.url,
            "TOKEN_SERVICE_API_KEYS": API_KEY,
            # long enough for the checks below to run inside the drain on a loaded machine
            "TOKEN_SERVICE_DRAIN_SECONDS": str(DRAIN_SECONDS),
        },
        workers=1,
    ).start()
    try:
        assert server.process is not None
        assert httpx.get(server.url + "/readyz").status_code == 200
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        draining = wait_until(
            lambda: (r := httpx.get(server.url + "/readyz")).status_code == 503 and r,
            timeout_seconds=DRAIN_SECONDS,
            what="/readyz to fail",
        )
        assert draining.json() == {"status": "draining"}
        # still serving meanwhile: liveness and real work
        assert httpx.get(server.url + "/healthz").status_code == 200
        assert httpx.post(server.url + "/token/generate", json={"scope": "s"}).status_code == 201
        assert server.process.wait(timeout=DRAIN_SECONDS + 30) == 0
        assert time.monotonic() - started >= DRAIN_SECONDS - 0.1
    finally:
        server.stop()
        redis_server.stop()


BAD_ENV = {"TOKEN_SERVICE_RATE_LIMIT": "lots"}


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        **BAD_ENV,
        "TOKEN_SERVICE_REDIS_URL": "redis://127.0.0.1:1/0",
        "PYTHONPATH": str(REPO_ROOT),
    }
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def assert_one_line_naming_the_variable(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    named = [line for line in result.stderr.splitlines() if "TOKEN_SERVICE_RATE_LIMIT" in line]
    assert len(named) == 1, result.stderr
    assert "configuration error" in named[0]


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["-m", "token_service.server.cli", "serve", "--port", "1"], id="serve"),
        pytest.param(["-m", "token_service.server.cli", "check"], id="check"),
        pytest.param(
            [
                "-m",
                "gunicorn",
                "-c",
                "python:token_service.server.gunicorn_conf",
                "token_service:create_app()",
            ],
            id="gunicorn-with-config",
        ),
        # from the repository, gunicorn finds ./gunicorn.conf.py by itself
        pytest.param(["-m", "gunicorn", "token_service:create_app()"], id="gunicorn-in-the-repo"),
    ],
)
def test_a_bad_setting_stops_start_up_with_one_line(args: list[str]) -> None:
    assert_one_line_naming_the_variable(run([sys.executable, *args], REPO_ROOT))


def test_a_bad_setting_stops_gunicorn_without_our_config(tmp_path: Path) -> None:
    """gunicorn loading create_app() with no config file at all: the app factory's own check."""
    result = run(
        [sys.executable, "-m", "gunicorn", "-b", f"127.0.0.1:{free_port()}", "token_service:create_app()"],
        tmp_path,
    )
    assert_one_line_naming_the_variable(result)
    assert "App failed to load" in result.stderr  # the master stopped, no respawn loop


@pytest.mark.parametrize(
    ("host", "hops", "refused"),
    [
        ("127.0.0.1", "0", False),
        ("::1", "0", False),
        ("localhost", "0", False),
        ("0.0.0.0", "0", True),  # every address
        ("10.1.2.3", "0", True),
        ("tokens.internal", "0", True),  # a name could resolve to anything
        ("0.0.0.0", "1", False),  # the nginx / Kubernetes recipes: a proxy declared
    ],
)
def test_granian_faces_clients_only_through_a_declared_proxy(host: str, hops: str, refused: bool) -> None:
    settings = Settings.from_env({"TOKEN_SERVICE_TRUSTED_PROXY_HOPS": hops})
    assert (exposure_refused(settings, host) is not None) == refused


def test_granian_on_a_public_address_without_a_proxy_stops_with_one_line() -> None:
    port = free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("TOKEN_SERVICE_")}
    serve = [sys.executable, "-m", "token_service.server.cli", "serve", "--server", "granian"]
    result = subprocess.run(
        [*serve, "--host", "0.0.0.0", "--port", str(port)],  # refused before it binds
        env={**env, "PYTHONPATH": str(REPO_ROOT)},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "TOKEN_SERVICE_TRUSTED_PROXY_HOPS=1" in lines[0]
    assert "deploy/nginx" in lines[0]
