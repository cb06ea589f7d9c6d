"""docs/testing-your-code.md: each Python block is a user's test file, and passes under pytest as it is.

The blocks are written to a folder of their own, each under the name its first line
gives (``# test_checkout.py``), with no conftest and no settings but pytest-asyncio's
(the FastAPI example's async tests), and run by pytest in a fresh interpreter: the
fixtures come from the installed package's ``pytest11`` entry point alone, as in a
user's project. Every test of every block must pass.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.docs import code_blocks

PAGE = "docs/testing-your-code.md"
NAMED = re.compile(r"# (test_\w+\.py)\n")

pytestmark = pytest.mark.slow


def _files() -> dict[str, str]:
    files = {}
    for block in code_blocks(PAGE, "python"):
        named = NAMED.match(block.code)
        assert named, f"{block.where}: a test file's block starts with '# test_<name>.py'"
        files[named.group(1)] = block.code
    return files


def _tests_in(code: str) -> int:
    return len(re.findall(r"^(?:async )?def test_", code, re.MULTILINE))


def test_every_block_is_a_test_file() -> None:
    files = _files()
    assert len(files) == len(code_blocks(PAGE, "python")), "two blocks share a file name"
    assert {"test_checkout.py", "test_flask_payments.py", "test_fastapi_payments.py"} <= files.keys()
    assert {"test_django_payments.py", "test_shipping.py"} <= files.keys()


@pytest.mark.parametrize("name", sorted(_files()))
def test_the_pages_example_passes_under_pytest(name: str, tmp_path: Path) -> None:
    code = _files()[name]
    (tmp_path / name).write_text(code)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nfilterwarnings = error\nasyncio_default_fixture_loop_scope = function\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    assert re.search(rf"\b{_tests_in(code)} passed\b", done.stdout), done.stdout[-2000:]
    assert "failed" not in done.stdout
    assert not list(tmp_path.rglob("conftest.py"))
