"""A missing browser skips the browser tests on a developer's machine and fails them under CI."""

from __future__ import annotations

import pytest

from tests.support.browser import unavailable


def test_a_missing_browser_skips_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="chromium is missing"):
        unavailable("/usr/bin/chromium is missing")


def test_a_missing_browser_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run the browser tests"):
        unavailable("/usr/bin/chromium is missing")
