"""The token-service command (the README's walk-through runs in tests/docs/test_code_blocks.py)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.support.processes import REPO_ROOT, free_port, wait_until

CLI = [sys.executable, "-m", "token_service.server.cli"]
DEV_KEY = "dev-service-key-change-me"


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOKEN_SERVICE_")}
    return subprocess.run(
        [*CLI, *args], env={**clean, **(env or {})}, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT
    )


def test_check_prints_the_effective_config_with_secrets_masked() -> None:
    result = run_cli(
        "check", env={"TOKEN_SERVICE_API_KEYS": "a-very-secret-service-key", "TOKEN_SERVICE_KEY_PREFIX": "x:"}
    )
    assert result.returncode == 0, result.stderr
    assert "TOKEN_SERVICE_KEY_PREFIX=x:" in result.stdout
    assert "TOKEN_SERVICE_API_KEYS=<1 configured>" in result.stdout
    assert "a-very-secret-service-key" not in result.stdout + result.stderr
    assert "embedded" in result.stdout


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TOKEN_SERVICE_DEFAULT_TTL_SECONDS", "soon"),
        ("TOKEN_SERVICE_MAX_TTL_SECONDS", "0"),
        ("TOKEN_SERVICE_RATE_LIMIT", "lots"),
        ("TOKEN_SERVICE_API_KEYS", "short"),
        ("TOKEN_SERVICE_API_KEYS", "sha256:nothex"),
        ("TOKEN_SERVICE_SUBJECT_HEADER", "Bad Header"),
        ("TOKEN_SERVICE_REDIS_TIMEOUT_SECONDS", "-1"),
    ],
)
def test_a_bad_value_stops_with_one_line_naming_the_variable(variable: str, value: str) -> None:
    for command in ("check", "serve"):
        result = run_cli(command, env={variable: value})
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert variable in lines[0]
        assert "Traceback" not in result.stderr


def test_check_reports_an_unreachable_redis() -> None:
    result = run_cli("check", env={"TOKEN_SERVICE_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"})
    assert result.returncode == 1
    assert "NOT reachable" in result.stderr


@pytest.mark.real
def test_check_pings_a_real_redis(redis_server) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("check", env={"TOKEN_SERVICE_REDIS_URL": redis_server.url})
    assert result.returncode == 0, result.stderr
    assert "Redis: reachable" in result.stdout
    # the service's worst case per request, which the proxies and probes in front are set from
    assert "Redis budget per request: 4 s " in result.stdout
    env = {"TOKEN_SERVICE_REDIS_URL": redis_server.url, "TOKEN_SERVICE_REDIS_TIMEOUT_SECONDS": "5"}
    assert "Redis budget per request: 10 s " in run_cli("check", env=env).stdout


@pytest.fixture
def embedded_service() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOKEN_SERVICE_")}
    process = subprocess.Popen(
        [*CLI, "serve", "--port", str(port), "--workers", "3"],
        env={**clean, "TOKEN_SERVICE_API_KEYS": DEV_KEY},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO_ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: httpx.get(url + "/healthz", timeout=1).status_code == 200, 60, what="token-service serve"
        )
        yield url, process
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)
        if process.stdout:
            process.stdout.close()


@pytest.mark.slow
def test_serve_runs_the_embedded_store_in_one_worker(
    embedded_service: tuple[str, subprocess.Popen[str]],
) -> None:
    url, process = embedded_service
    auth = {"Authorization": f"Bearer {DEV_KEY}"}
    with httpx.Client(base_url=url, timeout=10) as http:  # a new connection each time: any worker
        for _ in range(20):
            token = http.post("/token/generate", json={"scope": "s"}, headers={"Connection": "close"})
            consumed = http.post(
                "/token/consume",
                json={"token": token.json()["token"], "scope": "s"},
                headers={**auth, "Connection": "close"},
            )
            assert consumed.json() == {"outcome": "consumed", "replayed": False}  # one store

    process.send_signal(signal.SIGTERM)
    log = process.communicate(timeout=20)[0]
    assert "running 1 worker instead of 3" in log
    assert "EMBEDDED IN-MEMORY STORE" in log
    assert len(re.findall(r"Booting worker", log)) == 1


@pytest.mark.parametrize("command", [[], ["serve"], ["check"], ["db-cleanup"], ["admin"], ["admin", "list"]])
def test_help_is_plain_text(command: list[str]) -> None:
    result = run_cli(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert "usage: token-service" in result.stdout
    assert not re.search(r"``|:(func|class|mod|meth):`", result.stdout), result.stdout


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another program listens on, as 8000 is on a newcomer's laptop."""
    import socket

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        yield other.getsockname()[1]


def suggested_port(stderr: str, target: str) -> int:
    """The port a busy-port message suggests (``PORT=<n> make <target>``), checked free now."""
    import socket

    found = re.search(rf"PORT=(\d+) make {target}\b", stderr)
    assert found, stderr
    port = int(found.group(1))
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))  # raises if the suggestion is busy too
    return port


def test_serve_on_a_busy_port_names_the_setting(busy_port: int) -> None:
    result = run_cli("serve", "--port", str(busy_port))
    assert result.returncode == 2
    assert f"port {busy_port} on 127.0.0.1 is in use" in result.stderr
    port = suggested_port(result.stderr, "run")
    assert f"--port {port} " in result.stderr
    assert "Can't connect" not in result.stderr  # gunicorn never started


@contextlib.contextmanager
def listening(port: int) -> Iterator[None]:
    """``port`` busy for the block: listened on here, or already by another program."""
    import socket

    with socket.socket() as other:
        try:
            other.bind(("127.0.0.1", port))
            other.listen()
        except OSError:
            pass  # taken already: busy all the same
        yield


def test_the_hint_for_a_busy_port_is_not_that_port() -> None:
    # a newcomer who took the hint and ran PORT=8010 make run with 8010 busy too was told
    # "PORT=8010 make run" again
    with listening(8010):
        result = run_cli("serve", "--port", "8010")
        assert result.returncode == 2
        assert "port 8010 on 127.0.0.1 is in use" in result.stderr
        assert suggested_port(result.stderr, "run") != 8010


def test_the_hint_of_an_example_skips_ports_that_are_busy_too(busy_port: int) -> None:
    # the examples suggested the busy port + 10, busy or not
    if busy_port + 10 > 65535:
        pytest.skip("the ephemeral port is too close to the top for this test")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOKEN_SERVICE_")}
    with listening(busy_port + 10):
        result = subprocess.run(
            [sys.executable, "-m", "examples.fastapi_app"],
            env={**clean, "PORT": str(busy_port)},
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO_ROOT,
        )
        assert suggested_port(result.stderr, "example-fastapi") not in (busy_port, busy_port + 10)


def test_make_run_on_a_busy_port_names_the_setting(busy_port: int) -> None:
    from tests.support.docs import make_here, shell_env

    result = subprocess.run(
        ["bash", "-c", make_here("make run")],
        env=shell_env(PORT=str(busy_port)),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert result.returncode != 0
    assert f"port {busy_port} on 127.0.0.1 is in use" in result.stderr
    assert suggested_port(result.stderr, "run") != busy_port


@pytest.mark.parametrize(
    ("example", "target"), [("fastapi_app", "example-fastapi"), ("django_app", "example-django")]
)
def test_an_example_on_a_busy_port_names_the_setting(busy_port: int, example: str, target: str) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOKEN_SERVICE_")}
    result = subprocess.run(
        [sys.executable, "-m", f"examples.{example}"],
        env={**clean, "PORT": str(busy_port)},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 1
    assert f"port {busy_port} on 127.0.0.1 is in use" in result.stderr
    assert suggested_port(result.stderr, target) != busy_port


def test_check_writes_the_defaults_as_configuration_md_does() -> None:
    """`false` and `10`, not Python's `False` and `10.0`: what the page's table says, what a reader sets."""
    documented = {}
    for line in (REPO_ROOT / "docs/configuration.md").read_text().splitlines():
        row = re.match(r"\| `(TOKEN_SERVICE_\w+)` \| ([^|]+) \|", line)
        if row and not row.group(2).startswith("*"):  # *(none)* and the like: no literal default
            documented[row.group(1)] = row.group(2).split(" (")[0].strip().strip("`")
    result = run_cli("check")
    assert result.returncode == 0, result.stderr
    printed = dict(
        line.strip().split("=", 1)
        for line in result.stdout.splitlines()
        if line.startswith("  TOKEN_SERVICE_")
    )
    assert "TOKEN_SERVICE_REQUIRE_REQUEST_ID" in documented
    assert "TOKEN_SERVICE_BODY_TIMEOUT_SECONDS" in documented
    for name, value in documented.items():
        assert printed[name] == value, name


@pytest.mark.slow
@pytest.mark.parametrize("log_format", ["console", "json"])
def test_the_embedded_store_warning_in_each_log_format(log_format: str) -> None:
    """make run's console lines put the warning on a line of its own; production keeps JSON."""
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOKEN_SERVICE_")}
    process = subprocess.Popen(
        [*CLI, "serve", "--port", str(port)],
        env={**clean, "TOKEN_SERVICE_API_KEYS": DEV_KEY, "TOKEN_SERVICE_LOG_FORMAT": log_format},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO_ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: httpx.get(url + "/healthz", timeout=1).status_code == 200, 60, what="token-service serve"
        )
        httpx.get(url + "/", timeout=10)
    finally:
        process.send_signal(signal.SIGTERM)
        log = process.communicate(timeout=20)[0]
    [warning] = [line for line in log.splitlines() if "EMBEDDED IN-MEMORY STORE" in line]
    [access] = [
        line
        for line in log.splitlines()
        if "token_service.access" in line and ("route=/ " in line or '"route": "/"' in line)
    ]
    if log_format == "console":
        assert re.match(
            r"\d\d:\d\d:\d\d WARNING token_service\.\w+: TOKEN_SERVICE_REDIS_URL is not set", warning
        )
        assert re.match(r"\d\d:\d\d:\d\d INFO    token_service\.access: request .*status=200", access), access
    else:
        import json

        assert json.loads(warning)["level"] == "WARNING"
        assert json.loads(access)["status"] == 200
