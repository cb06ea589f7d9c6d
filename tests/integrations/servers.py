"""An app under a real server process (uvicorn, gunicorn), on a free port, for the integration tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import httpx

from tests.support.processes import REPO_ROOT, free_port, wait_until


class AppServer:
    """``uvicorn APP`` or ``gunicorn APP``; up once ``health_path`` answers."""

    def __init__(self, command: Sequence[str], env: dict[str, str], health_path: str = "/healthz") -> None:
        self.port = free_port()
        self.command = [part.replace("{port}", str(self.port)) for part in command]
        self.env = {**os.environ, **env}
        self.health_path = health_path
        self.log_path = Path(tempfile.mkstemp(prefix="ts-app-", suffix=".log")[1])
        self.process: subprocess.Popen[bytes] | None = None

    @classmethod
    def uvicorn(cls, app: str, env: dict[str, str], *extra: str) -> AppServer:
        command = [sys.executable, "-m", "uvicorn", app, "--port", "{port}", "--log-level", "warning", *extra]
        return cls(command, env)

    @classmethod
    def gunicorn(cls, app: str, env: dict[str, str], *extra: str) -> AppServer:
        command = [sys.executable, "-m", "gunicorn", "--bind", "127.0.0.1:{port}", *extra, app]
        return cls(command, env)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> AppServer:
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT
            )

        def up() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"the server exited:\n{self.log()}")
            return httpx.get(self.url + self.health_path, timeout=1).status_code == 200

        try:
            wait_until(up, timeout_seconds=60, what=" ".join(self.command))
        except BaseException:
            self.stop()
            raise
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log_path.unlink(missing_ok=True)
