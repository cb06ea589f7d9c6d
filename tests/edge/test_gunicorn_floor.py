"""The oldest gunicorn and gevent that pyproject.toml allows still run ``token-service serve``.

The gunicorn config subclasses gunicorn's logger and replaces its error
writer; both moved between releases (``Logger._compute_access_log_enabled``
exists only from 27 on, and ``serve`` used to fail at start on 23, 25 and
26). This installs the floor releases of both (from PyPI, into a temporary
folder in front of the venv's newer ones), runs ``token-service serve`` on
them against a real redis-server and checks what the config promises:
gevent workers, keep-alive, JSON logs with no access-log noise, problem+json
for gunicorn's own error replies. ``TOKEN_SERVICE_GUNICORN_VERSIONS`` (e.g.
``23.0.0,25.3.0``) runs other releases too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import httpx
import pytest

from tests.support.processes import REPO_ROOT, RedisServer, free_port, wait_until
from tests.support.raw_http import connect, exchange, read_reply, request_bytes
from tests.support.service import API_KEY

pytestmark = [pytest.mark.slow, pytest.mark.real]


def floor(name: str) -> str:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    for requirement in pyproject["project"]["optional-dependencies"]["server"]:
        found = re.fullmatch(rf"{name}(\[[^\]]*\])?>=([\d.]+)", requirement)
        if found:
            return found.group(2)
    raise AssertionError(f"no {name}>=X (or {name}[extras]>=X) requirement in the server extra")


def versions() -> list[str]:
    extra = os.environ.get("TOKEN_SERVICE_GUNICORN_VERSIONS", "")
    return [floor("gunicorn"), *(v.strip() for v in extra.split(",") if v.strip())]


def install(target: Path, *requirements: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), *requirements],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        message = f"could not install {requirements} from PyPI: {done.stderr[-500:]}"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@pytest.mark.parametrize("gunicorn_version", versions())
def test_serve_runs_on_the_oldest_allowed_gunicorn_and_gevent(
    gunicorn_version: str, tmp_path: Path, redis_server: RedisServer
) -> None:
    gevent_version = floor("gevent")
    site = tmp_path / "site"
    # with gunicorn's gevent extra, as the server extra asks: it brings what the gevent worker imports
    install(site, f"gunicorn[gevent]=={gunicorn_version}", f"gevent=={gevent_version}")
    port = free_port()
    env = {
        key: value for key, value in os.environ.items() if not key.startswith(("TOKEN_SERVICE_", "GUNICORN_"))
    }
    env.update(
        {
            "PYTHONPATH": f"{site}{os.pathsep}{REPO_ROOT}",
            "TOKEN_SERVICE_REDIS_URL": redis_server.url,
            "TOKEN_SERVICE_API_KEYS": API_KEY,
            "WEB_CONCURRENCY": "2",
        }
    )
    check = subprocess.run(
        [sys.executable, "-c", "import gunicorn, gevent; print(gunicorn.__version__, gevent.__version__)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    installed = check.stdout.split()
    assert installed[0].startswith(gunicorn_version)
    assert installed[1].startswith(gevent_version)
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "token_service.server.cli", "serve", "--port", str(port)],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: httpx.get(url + "/healthz", timeout=1).status_code == 200, 60, what="serve")
        address = ("127.0.0.1", port)
        with connect(address) as sock:  # kept alive: three requests, one connection
            for _ in range(3):
                sock.sendall(
                    request_bytes(
                        "POST", "/token/generate", b'{"scope": "floor"}', {"Content-Type": "application/json"}
                    )
                )
                assert read_reply(sock).status == 201
        too_large = exchange(
            address, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n"
        )
        assert too_large.status == 431
        assert too_large.json()["code"] == "invalid_request"
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert server.returncode == 0, log.read_text()[-3000:]
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert any("gevent" in str(line.get("message")) for line in lines if line["logger"] == "gunicorn.error")
    assert not [line for line in lines if line["logger"] == "gunicorn.access"]
    assert sum(line["logger"] == "token_service.access" for line in lines) >= 4
    assert not [line for line in lines if line["level"] in ("ERROR", "CRITICAL")]


def test_serve_without_the_server_extra_names_it(tmp_path: Path) -> None:
    blocker = tmp_path / "sitecustomize.py"
    # as if the extra were not installed: importing gunicorn fails
    blocker.write_text("import sys\nsys.modules['gunicorn'] = None\n")
    done = subprocess.run(
        [sys.executable, "-m", "token_service.server.cli", "serve", "--port", "1"],
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO_ROOT}", "TOKEN_SERVICE_REDIS_URL": ""},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "pip install 'idempotency-token-service[server]'" in done.stderr
