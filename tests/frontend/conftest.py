"""Fixtures for the browser tests: Debian's Chromium driven by Playwright, and the demo.

Playwright for Python drives the system browser (``/usr/bin/chromium``, from
Debian's ``chromium`` package); it never downloads one. Without the browser
the browser tests skip with the reason — except under CI (``CI`` set), where
a missing browser fails the run instead of passing it silently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, RunningDemo, start_demo, stop_demo, unavailable


# Package scope: the browser (and Playwright's event loop) is gone before other packages' asyncio tests.
@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    if not CHROMIUM.is_file():
        unavailable(f"{CHROMIUM} is missing: apt-get install chromium to run the browser tests")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("playwright is not installed: pip install -e '.[dev]'")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def context(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 900, "height": 820})
    # 30 s: a page, its scripts and the services behind it can be that slow on a loaded CI machine;
    # what is waited for ends the wait sooner
    context.set_default_timeout(30_000)
    yield context
    context.close()


@pytest.fixture
def demo_factory() -> Iterator[Callable[..., RunningDemo]]:
    started: list[RunningDemo] = []

    def start(**options: Any) -> RunningDemo:
        started.append(start_demo(**options))
        return started[-1]

    yield start
    for running in started:
        stop_demo(running)


@pytest.fixture
def demo(demo_factory: Callable[..., RunningDemo]) -> RunningDemo:
    return demo_factory()
