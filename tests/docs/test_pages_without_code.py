"""Pages with no code block yet. When a page gets one, the test that runs it takes the
page over in tests/docs/test_code_blocks.py's RUN_ELSEWHERE, and the page leaves this list."""

from __future__ import annotations

import pytest

from tests.support.docs import code_blocks

PAGES = ["docs/configuration.md", "docs/performance.md"]


@pytest.mark.parametrize("page", PAGES)
def test_the_page_has_no_code_block(page: str) -> None:
    assert code_blocks(page) == [], f"{page} has code now: name the test that runs it in test_code_blocks.py"
