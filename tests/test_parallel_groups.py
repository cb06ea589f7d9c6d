"""tests/conftest.py's lists name what exists: a renamed file would silently leave them.

A file dropped from ``_LEASES`` would run beside the other lease-timed tests again, one dropped
from ``_SLOW_FIRST`` would start last; neither fails a run, so this does.
"""

from __future__ import annotations

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
