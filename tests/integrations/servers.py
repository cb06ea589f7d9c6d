"""An app under a real server process (uvicorn, gunicorn), on a free port, for the integration tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tests.support.processes import REPO_ROOT, PortTaken, answers_healthz, start_serving


class AppServer:
    """``uvicorn APP`` or ``gunicorn APP``; up once ``health_path`` answers.

    ``{port}`` in the command or in an environment value is the free port start() picks.
    """

    def __init__(self, command: Sequence[str], env: dict[str, str], health_path: str = "/healthz") -> None:
        self.port = 0  # start() picks a free one
        self.command = list(command)
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
        def launch(port: int) -> subprocess.Popen[bytes]:
            command = [part.replace("{port}", str(port)) for part in self.command]
            env = {name: value.replace("{port}", str(port)) for name, value in self.env.items()}
            with self.log_path.open("wb") as log:
                return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)

        try:
            self.process, self.port = start_serving(
                launch, answers_healthz(self.health_path), " ".join(self.command)
            )
        except (PortTaken, RuntimeError, TimeoutError) as exc:
            raise type(exc)(f"{exc}:\n{self.log()}") from exc
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
