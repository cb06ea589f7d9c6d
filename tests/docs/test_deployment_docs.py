"""docs/deployment.md's commands, run as written (on a free port) against a real Redis.

``docker compose up --build`` needs a Docker engine, which the test machines do not
have: the Dockerfile and docker-compose.yml are checked by tests/edge/test_deployment.py,
and the request that follows it here runs against the service started as the image does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from tests.support.dockerfile import graceful_timeout_seconds, runtime_image
from tests.support.docs import code_blocks, run_sh, shell_env
from tests.support.processes import REPO_ROOT, RedisServer, free_port, wait_until
from tests.support.service import service_env

pytestmark = [pytest.mark.real, pytest.mark.slow]

PAGE = "docs/deployment.md"


def commands(number: int) -> list[str]:
    block = code_blocks(PAGE, "sh")[number]
    return [line.split("   #", 1)[0].strip() for line in block.code.splitlines() if line.strip()]


def test_the_page_has_three_command_blocks() -> None:
    assert len(code_blocks(PAGE)) == 3
    assert [command.split()[0] for command in commands(0)] == ["token-service", "token-service", "gunicorn"]


def test_the_docker_build_labels_the_version_and_the_run_outlasts_the_drain() -> None:
    # the image itself is built and run by tests/image/test_image.py (podman, on a stand-in base)
    import token_service

    block = code_blocks(PAGE, "sh")[1].code
    assert block.startswith("docker build --build-arg VERSION=")
    version_command = re.search(r'VERSION="\$\((.*)\)"', block)
    assert version_command
    printed = subprocess.run(
        ["bash", "-c", version_command.group(1)], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert printed == token_service.__version__
    drain_seconds = int(runtime_image().env["TOKEN_SERVICE_DRAIN_SECONDS"])
    graceful_seconds = graceful_timeout_seconds()
    stop_timeout = re.search(r"--stop-timeout (\d+)", block)
    assert stop_timeout
    assert int(stop_timeout.group(1)) > drain_seconds + graceful_seconds
    # the Dockerfile's own example says the same
    assert f"docker run --stop-timeout {stop_timeout.group(1)} " in (REPO_ROOT / "Dockerfile").read_text()


@contextlib.contextmanager
def started(command: str, port: int, redis_url: str) -> Iterator[str]:
    process = subprocess.Popen(
        ["bash", "-c", command.replace("--port 8000", f"--port {port}").replace(":8000", f":{port}")],
        cwd=REPO_ROOT,
        env=shell_env(**service_env(redis_url), PORT=str(port)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(url + "/readyz", timeout=1).status_code == 200, 60, 0.1, what=command)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


@pytest.mark.parametrize("number", [0, 2])
def test_serve_and_gunicorn_by_hand_answer(number: int, redis_server: RedisServer) -> None:
    with started(commands(0)[number], free_port(), redis_server.url) as url:
        token = httpx.post(url + "/token/generate", json={"scope": "s"}, timeout=30).json()["token"]
        assert (
            httpx.post(url + "/token/inspect", json={"token": token}, timeout=30).status_code == 401
        )  # needs the key


def test_check_pings_redis(redis_server: RedisServer) -> None:
    result = subprocess.run(
        ["bash", "-c", commands(0)[1]],
        cwd=REPO_ROOT,
        env=shell_env(**service_env(redis_server.url)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "Redis: reachable" in result.stdout


def test_the_request_after_compose_up(redis_server: RedisServer) -> None:
    block = code_blocks(PAGE, "sh")[2]
    assert block.code.startswith("docker compose up --build\n")
    request = dataclasses.replace(block, code=block.code.split("\n", 1)[1])
    with started(commands(0)[0], free_port(), redis_server.url) as url:
        output = run_sh(request, base_url=url)
        assert '"token":' in output


def test_the_command_by_hand_binds_what_serve_binds() -> None:
    """Without --bind, gunicorn listens on 127.0.0.1:8000 only: not "the same" as serve's 0.0.0.0."""
    serve, _check, by_hand = commands(0)
    options = dict(zip(serve.split()[2::2], serve.split()[3::2], strict=True))
    assert f"--bind {options['--host']}:{options['--port']}" in by_hand
    assert f"--workers {options['--workers']}" in by_hand
