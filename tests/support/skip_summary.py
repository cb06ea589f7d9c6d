"""One line at the end of a run: what skipped for a missing system package, and its install command.

A test that needs a system tool skips (or, under CI, fails) with a reason that names
the Debian package the way a reader would type it: ``… (apt-get install nginx)`` —
see ``redis_server_binary`` in processes.py. This plugin (loaded by tests/conftest.py)
gathers those packages from the run's skip reasons, so a ``make test`` on a laptop
without chromium or nginx ends by saying so instead of passing quietly.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

import pytest

# "(apt-get install nodejs npm)", "apt-get install chromium to run …": Debian package names,
# up to a closing parenthesis, the end, punctuation or " to "
APT_INSTALL = re.compile(
    r"apt-get install ([a-z0-9][a-z0-9.+-]*(?: [a-z0-9][a-z0-9.+-]*)*?)(?=\)|$| to |[:;,])"
)


def packages_of(reason: str) -> list[str]:
    found = APT_INSTALL.search(reason)
    return found.group(1).split() if found else []


def summary_line(reasons: Iterable[str]) -> str | None:
    """``None`` when nothing skipped for a package; else the tests per package and the command."""
    tests: Counter[str] = Counter()
    for reason in reasons:
        for package in packages_of(reason):
            tests[package] += 1
    if not tests:
        return None
    counts = ", ".join(f"{package} ({count})" for package, count in sorted(tests.items()))
    return (
        f"skipped for a missing system package: {counts}; "
        f"to run them: sudo apt-get install {' '.join(sorted(tests))}"
    )


def skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])  # (path, line, "Skipped: <reason>")
    return str(longrepr)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    line = summary_line(skip_reason(report) for report in terminalreporter.stats.get("skipped", []))
    if line:
        terminalreporter.write_line(line, yellow=True, bold=True)
