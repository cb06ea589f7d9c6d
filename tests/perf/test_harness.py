"""The benchmark harness runs end to end (``python -m benchmarks --quick``).

Quick mode runs every part for about a second: it proves the harness,
its servers and its report work. It asserts nothing about speed — speed is
the full run's business (benchmarks/RESULTS.md) — only that every figure
was measured and written.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.real]


def require_binary(name: str) -> None:
    if shutil.which(name) is None:
        message = f"{name} is not installed (apt-get install {name}): the benchmark harness needs it"
        if os.environ.get("CI"):
            pytest.fail(message + " — CI must run this test", pytrace=False)
        pytest.skip(message)


def run_module(*args: str, timeout_seconds: float) -> subprocess.CompletedProcess[str]:
    """``python -m <args>`` from the repository root; fails the test unless it exits 0."""
    done = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_seconds,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_quick_mode_runs_every_part_and_writes_the_report(tmp_path: Path) -> None:
    for binary in ("wrk", "redis-server", "redis-benchmark"):
        require_binary(binary)
    run_module("benchmarks", "--quick", "--out", str(tmp_path), timeout_seconds=420)

    results = json.loads((tmp_path / "results.json").read_text())
    for endpoint in ("generate", "consume"):
        peak = results["peak"][endpoint]
        assert peak["service"]["rps"] > 0
        assert peak["baseline"]["rps"] > 0
        assert peak["ratio"] > 0
    targets = ("service", "baseline", "baseline-sync", "fastapi", "granian")
    assert {(p["endpoint"], p["target"]) for p in results["curve"]} == {
        (e, t) for e in ("generate", "consume") for t in targets
    }
    # the worker-class comparison and the three baselines, each measured and paired with the service
    for endpoint in ("generate", "consume"):
        peak = results["peak"][endpoint]
        for target in ("baseline-sync", "fastapi", "service-sync", "service-gthread", "granian"):
            assert peak[target]["rps"] > 0, target
        assert set(peak["pairs"]) >= {
            "service / baseline-sync",
            "service / fastapi",
            "service / service-sync",
            "granian / fastapi",
        }
    report_text = (tmp_path / "RESULTS.md").read_text()
    assert "## Worker classes" in report_text
    assert "hand-written FastAPI, uvicorn" in report_text
    assert results["half_peak"]["p99_ms"] > 0
    assert results["half_peak"]["baseline"]["p99_ms"] > 0
    assert results["half_peak_granian"]["p99_ms"] > 0
    assert results["half_peak_granian"]["reference"] == "fastapi"
    assert results["batch"]["tokens_per_second"] > 0
    assert set(results["direct"]["ops_per_second"]) >= {"redis-py EVALSHA", "TokenStore.consume"}
    assert set(results["app_cpu"]["endpoints"]) == {"generate", "consume"}
    assert results["app_cpu"]["endpoints"]["generate"]["service_us"] > 0
    assert results["memory"]["tokens"] == results["config"]["memory_tokens"]
    assert 50 < results["memory"]["bytes_per_token"] < 1000  # a real measurement, not a placeholder
    assert results["memory"]["per_client"]["bytes_per_client"] > 0
    assert set(results["direct"]["cpu_ratios"]) == set(results["direct"]["ratios"])
    assert [r["rps"] > 0 for r in results["redis"]] == [True] * 6
    assert len(results["budgets"]) >= 6
    assert results["failed_requests"] == 0  # every request answered 2xx: bodies, keys and tokens right

    report = (tmp_path / "RESULTS.md").read_text()
    assert "QUICK MODE" in report
    for budget in results["budgets"]:
        assert budget["budget"] in report
    png = (tmp_path / "results.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    assert len(png) > 10_000


def test_app_cpu_measures_both_apps_in_process() -> None:
    require_binary("redis-server")
    # app_cpu raises (exits non-zero) if any reply was not the expected 201 / 200
    done = run_module("benchmarks.app_cpu", "--requests", "50", "--rounds", "1", timeout_seconds=120)
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["generate", "consume"]
    assert all("us of CPU per request" in line for line in lines)


def test_the_http_budgets_run_measures_both_servers_against_their_baselines() -> None:
    for binary in ("wrk", "redis-server"):
        require_binary(binary)
    done = run_module("benchmarks.http_budgets", "--quick", timeout_seconds=300)
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    for budget in ("gunicorn (gevent) vs hand-written Flask on sync workers", "granian vs FastAPI + uvicorn"):
        assert [row.split(" | ")[1] for row in rows if row.startswith(f"| {budget} |")] == [
            "generate",
            "consume",
        ]
    assert any(row.startswith("| granian | ") and " ms " in row for row in rows)


def test_routes_callgrind_counts_instructions_per_request_of_each_route() -> None:
    for binary in ("valgrind", "redis-server"):
        require_binary(binary)
    done = run_module("benchmarks.routes_callgrind", "--requests", "20", timeout_seconds=600)
    counts = json.loads(done.stdout)
    for app in ("service", "baseline"):
        for route in ("generate", "consume"):
            # a Python request is hundreds of thousands of instructions; a broken phase is ~0
            assert counts[app][route] > 50_000, (app, route)


def test_server_callgrind_counts_a_whole_worker_per_request() -> None:
    for binary in ("valgrind", "redis-server", "wrk"):
        require_binary(binary)
    done = run_module(
        "benchmarks.server_callgrind",
        *("--targets", "floor", "--endpoints", "generate", "--seconds", "1"),
        timeout_seconds=900,
    )
    counts = json.loads(done.stdout[done.stdout.index("{") :])
    # gunicorn's side of a request alone is hundreds of thousands of instructions; a broken run ~0
    assert counts["floor"]["generate"] > 50_000
