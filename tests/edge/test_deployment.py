"""The Dockerfile and docker-compose.yml: checked as files, and the image's commands run for real.

There is no Docker engine here, so the image's CMD and HEALTHCHECK are run
directly, with the image's ENV, against a real redis-server.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.dockerfile import final_stage, graceful_timeout_seconds, image_env, instructions
from tests.support.processes import REPO_ROOT, SERVERS, RedisServer, free_port, wait_until


def exec_form(arguments: str) -> list[str]:
    parsed = json.loads(arguments)
    assert isinstance(parsed, list), "exec form (a JSON array), so signals reach the server"
    return [str(part) for part in parsed]


DOCKERFILE = instructions(REPO_ROOT / "Dockerfile")
RUNTIME = final_stage(DOCKERFILE)


def the(keyword: str) -> str:
    found = [arguments for kw, arguments in RUNTIME if kw == keyword]
    assert len(found) == 1, f"one {keyword} in the runtime stage"
    return found[0]


def test_the_image_is_multi_stage_slim_and_runs_as_a_user() -> None:
    froms = [arguments for keyword, arguments in DOCKERFILE if keyword == "FROM"]
    assert len(froms) >= 2
    # one base for both stages, python:3.12-slim unless the build says otherwise (the image
    # test's stand-in): the build stage's venv is copied into the runtime, so they must match
    assert ("ARG", "BASE_IMAGE=python:3.12-slim") in DOCKERFILE[: [kw for kw, _ in DOCKERFILE].index("FROM")]
    assert all(arguments.split()[0] == "${BASE_IMAGE}" for arguments in froms)
    user = the("USER").split(":")[0]
    assert user not in ("root", "0")
    # nothing runs as root after the switch, and the build stage's tools stay behind
    after_user = RUNTIME[[kw for kw, _ in RUNTIME].index("USER") :]
    assert "RUN" not in [kw for kw, _ in after_user]
    for keyword, arguments in DOCKERFILE:
        if keyword == "COPY" and not arguments.startswith("--from"):
            assert (REPO_ROOT / arguments.split()[0]).exists(), arguments


def test_the_runtime_stage_copies_in_one_installed_environment_and_deletes_nothing() -> None:
    # Docker keeps every instruction's layer: wheels copied in and deleted by a later RUN still
    # weighed 8.04 MB in the image (measured: 267.6 MB with them, 259.6 MB with the venv copied)
    copies = [arguments for keyword, arguments in RUNTIME if keyword in ("COPY", "ADD")]
    assert copies == ["--from=build /opt/venv /opt/venv"]
    for keyword, arguments in RUNTIME:
        if keyword == "RUN":
            assert not re.search(r"\brm\b", arguments), arguments
    assert image_env(RUNTIME)["PATH"].startswith("/opt/venv/bin:")


def test_the_healthcheck_needs_no_curl() -> None:
    healthcheck = the("HEALTHCHECK")
    command = exec_form(healthcheck[healthcheck.index("CMD") + 3 :].strip())
    assert command[0] == "python"
    assert not {"curl", "wget"} & set(" ".join(command).split())


SERVE = 'exec token-service serve --host 0.0.0.0 --port "$PORT"'


def test_the_command_is_token_service_serve_on_the_port() -> None:
    # a shell only to expand $PORT, replaced by serve (exec): SIGTERM reaches serve, which drains;
    # serve runs the server TOKEN_SERVICE_SERVER names, gunicorn with its config by default
    assert exec_form(the("CMD")) == ["/bin/sh", "-c", SERVE]


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("server", sorted(SERVERS))
def test_the_image_command_serves_and_its_healthcheck_passes(redis_server: RedisServer, server: str) -> None:
    port = free_port()
    env = {
        **os.environ,
        **image_env(RUNTIME),
        # the image's PATH starts with its venv's bin, where `token-service` is; here, this one's
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PORT": str(port),
        "WEB_CONCURRENCY": "2",
        "TOKEN_SERVICE_SERVER": server,
        "TOKEN_SERVICE_TRUSTED_PROXY_HOPS": "1",  # behind a proxy, as granian must be
        "TOKEN_SERVICE_REDIS_URL": redis_server.url,
        "TOKEN_SERVICE_API_KEYS": "image-test-key-0123456789",
    }
    shell, flag, script = exec_form(the("CMD"))
    # the image binds 0.0.0.0:$PORT; here, stay on the loopback
    command = [shell, flag, script.replace("--host 0.0.0.0", "--host 127.0.0.1")]
    healthcheck = the("HEALTHCHECK")
    probe = exec_form(healthcheck[healthcheck.index("CMD") + 3 :].strip())
    python = [sys.executable]

    def healthy() -> bool:
        return subprocess.run(python + probe[1:], env=env, capture_output=True, timeout=10).returncode == 0

    assert not healthy(), "nothing is listening yet: the probe must fail"
    server_process = subprocess.Popen(command, env=env, cwd=REPO_ROOT, stderr=subprocess.PIPE)
    try:
        wait_until(healthy, timeout_seconds=60, what="the HEALTHCHECK command to pass")
        url = f"http://127.0.0.1:{port}"
        generated = httpx.post(url + "/token/generate", json={"scope": "image"}, timeout=30)
        assert generated.status_code == 201
        assert generated.headers.get("server", "gunicorn") == server  # granian names itself
        assert httpx.get(url + "/readyz", timeout=30).status_code == 200
    finally:
        server_process.terminate()  # the shell is gone (exec): this reaches serve, which drains
        server_process.wait(timeout=60)
        assert server_process.stderr is not None
        server_process.stderr.close()
    assert server_process.returncode == 0
    assert not healthy()


def test_compose_runs_redis_with_aof_and_points_the_service_at_it() -> None:
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    redis_service = compose["services"]["redis"]
    command = redis_service["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert any(volume.endswith(":/data") for volume in redis_service["volumes"])
    service = compose["services"]["token-service"]
    assert service["build"] == "."
    assert service["environment"]["TOKEN_SERVICE_REDIS_URL"].startswith("redis://redis:")
    assert service["depends_on"]["redis"]["condition"] == "service_healthy"
    # drain + graceful_timeout must fit in the stop timeout
    assert (
        int(service["stop_grace_period"].rstrip("s"))
        > int(image_env(RUNTIME)["TOKEN_SERVICE_DRAIN_SECONDS"]) + graceful_timeout_seconds()
    )
