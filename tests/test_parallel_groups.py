"""tests/conftest.py's lists name what exists: a renamed file would silently leave them.

A file dropped from ``_LEASES`` would run beside the other lease-timed tests again, one dropped
from ``_SLOW_FIRST`` would start last; neither fails a run, so this does.
"""

from __future__ import annotations

import re
import subprocess
import sys

from tests import conftest
from tests.support.processes import REPO_ROOT
from tests.test_dependency_floors import CASES


def test_every_lease_timed_file_exists() -> None:
    assert [path for path in conftest._LEASES if not (REPO_ROOT / path).is_file()] == []


def test_every_slow_group_exists() -> None:
    groups = {"leases", *(f"floors[{case}]" for case in CASES)}
    missing = [
        name for name in conftest._SLOW_FIRST if name not in groups and not (REPO_ROOT / name).is_file()
    ]
    assert missing == []


def test_a_group_runs_whole_on_one_worker() -> None:
    """pytest 9 once made xdist drop the groups without a word (tests/conftest.py's _GroupInNodeId):
    every test must reach its worker with its group, and a file's tests share one worker."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-v",
            "-p",
            "no:cacheprovider",
            "tests/test_tokens.py",
            "tests/fuzz/test_json_numbers_and_nesting.py",
            "-m",
            "fake or not real",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = re.findall(r"^\[(gw\d+)\] \[ *\d+%\] PASSED (\S+?)(@\S+)? *$", done.stdout, re.MULTILINE)
    assert len(ran) > 20, done.stdout[-3000:]
    assert [nodeid for _, nodeid, group in ran if not group] == []
    workers: dict[str, set[str]] = {}
    for worker, _, group in ran:
        workers.setdefault(group, set()).add(worker)
    assert {group: len(seen) for group, seen in workers.items()} == dict.fromkeys(workers, 1)
