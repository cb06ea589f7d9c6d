"""The embedded in-memory store is served by one gunicorn worker, however gunicorn is started.

Two workers would each have a store of their own (a token issued by one is
unknown to the other), so a second worker refuses to load the app and
gunicorn stops with a message that says what to do. One worker serves.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import pytest

from tests.support.processes import REPO_ROOT, free_port, wait_until
from token_service.server.embedded import MESSAGE

pytestmark = pytest.mark.slow

DEV_KEY = "dev-service-key-change-me"


def gunicorn(*args: str, port: int) -> subprocess.Popen[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("TOKEN_SERVICE_")}
    env["TOKEN_SERVICE_API_KEYS"] = DEV_KEY
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--bind",
            f"127.0.0.1:{port}",
            *args,
            "token_service:create_app()",
        ],
        env=env,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["-w", "2"],
        ["-w", "2", "--preload"],
        ["--config", "python:token_service.server.gunicorn_conf", "-w", "2"],
    ],
    ids=["workers", "preload", "our-config"],
)
def test_a_second_worker_stops_gunicorn_with_a_clear_message(args: list[str]) -> None:
    process = gunicorn(*args, port=free_port())
    try:
        output, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        raise AssertionError(f"gunicorn kept running with {args}: {output}") from None
    assert process.returncode != 0
    assert MESSAGE in output
    assert "App failed to load" in output
    assert "Traceback" not in output


def test_one_worker_serves_every_request_from_one_store() -> None:
    port = free_port()
    process = gunicorn("-w", "1", port=port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(url + "/healthz", timeout=1).status_code == 200, 60, what="gunicorn")
        auth = {"Authorization": f"Bearer {DEV_KEY}"}
        for _ in range(10):
            token = httpx.post(url + "/token/generate", json={"scope": "s"}, timeout=30).json()["token"]
            consumed = httpx.post(
                url + "/token/consume", json={"token": token, "scope": "s"}, headers=auth, timeout=30
            )
            assert consumed.json() == {"outcome": "consumed", "replayed": False}
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
