"""The run's one line about tests skipped for a missing system package (tests/support/skip_summary.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT
from tests.support.skip_summary import summary_line


def test_the_line_counts_tests_per_package_and_gives_the_command() -> None:
    reasons = [
        "Skipped: /usr/bin/chromium is missing: apt-get install chromium to run the browser tests",
        "Skipped: /usr/bin/chromium is missing: apt-get install chromium to run the browser tests",
        "Skipped: node and npm are missing (apt-get install nodejs npm)",
        "Skipped: nginx is not installed: the proxy recipe's test needs it (apt-get install nginx)",
        "Skipped: slow on purpose",
    ]
    assert summary_line(reasons) == (
        "skipped for a missing system package: chromium (2), nginx (1), nodejs (1), npm (1); "
        "to run them: sudo apt-get install chromium nginx nodejs npm"
    )
    assert summary_line(["Skipped: slow on purpose"]) is None


# slow: a pytest run of its own in a subprocess (16 s, loaded)
@pytest.mark.slow
def test_a_run_ends_with_it(tmp_path: Path) -> None:
    (tmp_path / "test_needs_tools.py").write_text(
        "import pytest\n"
        "def test_a():\n    pytest.skip('nginx is not installed (apt-get install nginx)')\n"
        "@pytest.mark.skipif(True, reason='redis-benchmark is missing (apt-get install redis-tools)')\n"
        "def test_b():\n    pass\n"
        "def test_c():\n    pytest.skip('not today')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.skip_summary", "-p", "no:cacheprovider",
         "-o", "addopts=", str(tmp_path)],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if "missing system package" in line]
    assert lines == [
        "skipped for a missing system package: nginx (1), redis-tools (1); "
        "to run them: sudo apt-get install nginx redis-tools"
    ]
