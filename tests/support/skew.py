"""Client processes whose wall clock is wrong: Debian's ``faketime`` around a Python child.

``faketime -f -10s`` shifts what the child's ``time.time()`` / ``datetime.now()``
read; ``FAKETIME_DONT_FAKE_MONOTONIC=1`` leaves ``time.monotonic()`` true, as
on a real host whose clock is off (a VM after suspend, a container without
NTP). Redis, the service and the databases keep the machine's clock.

The child reports its ``time.time()`` first; :meth:`Skewed.check_shifted`
holds it to the shift, so a test cannot pass because faketime did nothing.
Without ``faketime`` the tests skip with the reason, except under CI (``CI``
set), where they fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import REPO_ROOT

CHILD = "tests.support.skewed_child"


def faketime_binary() -> str:
    binary = shutil.which("faketime")
    if binary:
        return binary
    message = "faketime is not installed: the clock-skew tests need it (apt-get install faketime)"
    if os.environ.get("CI"):
        pytest.fail(message + " — CI must run them", pytrace=False)
    pytest.skip(message)


SITE = Path(__file__).with_name("faketime_site")


def faketime_command(shift_seconds: int) -> list[str]:
    """The prefix that runs a command with its wall clock ``shift_seconds`` off."""
    return [faketime_binary(), "-f", f"{shift_seconds:+d}s"]


def faketime_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a Python process under :func:`faketime_command`: its monotonic clock left true,
    and ``time.sleep`` mended for faketime (faketime_site/sitecustomize.py)."""
    path = os.pathsep.join(part for part in (str(SITE), env.get("PYTHONPATH", "")) if part)
    return {**env, "FAKETIME_DONT_FAKE_MONOTONIC": "1", "PYTHONPATH": path}


class Skewed:
    """``python -m tests.support.skewed_child SCENARIO ARGS`` with its wall clock ``shift_seconds`` off."""

    def __init__(self, shift_seconds: int, scenario: str, args: dict[str, Any]) -> None:
        self.shift_seconds = shift_seconds
        self.started_at = time.time()  # before the child exists: its real clock reads at least this
        command = [*faketime_command(shift_seconds), sys.executable, "-m", CHILD, scenario, json.dumps(args)]
        env = faketime_env({**os.environ, "PYTHONUNBUFFERED": "1"})
        self.process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # faketime runs the command as its child: kill() ends the whole group, or the child
            # would live on holding our pipes
            start_new_session=True,
        )

    def send(self, **fields: Any) -> None:
        """A line for the child's next :func:`~tests.support.skewed_child.told`."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(fields) + "\n")
        self.process.stdin.flush()

    def read(self) -> dict[str, Any]:
        """The child's next report (one JSON object a line); fails with its stderr if it ended."""
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=60)
            assert self.process.stderr is not None
            pytest.fail(
                f"the skewed child ended early (rc {self.process.returncode}):\n{self.process.stderr.read()}"
            )
        report: dict[str, Any] = json.loads(line)
        return report

    def check_shifted(self) -> None:
        """The child's first report is its time.time(): shifted by the offset, whatever the machine's pace."""
        child_time = self.read()["time"]
        read_at = time.time()  # the child read its clock before we read its report
        assert (
            self.started_at + self.shift_seconds - 0.01 <= child_time <= read_at + self.shift_seconds + 0.01
        ), (
            f"faketime did not shift the child's clock by {self.shift_seconds} s "
            f"(child {child_time}, here {self.started_at}..{read_at})"
        )

    def finish(self) -> dict[str, Any]:
        """The child's last report, once it exited cleanly."""
        report = self.read()
        self.process.wait(timeout=120)
        assert self.process.stderr is not None
        errors = self.process.stderr.read()
        assert self.process.returncode == 0, errors
        return report

    def kill(self) -> str:
        """End the child (if it still runs); returns what it wrote on stderr."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        errors = ""
        if self.process.stderr is not None and not self.process.stderr.closed:
            errors = self.process.stderr.read()
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        return errors

    def __enter__(self) -> Skewed:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        errors = self.kill()
        if exc is not None and errors:
            exc.add_note(f"the skewed child ({self.shift_seconds:+d} s) wrote:\n{errors}")
