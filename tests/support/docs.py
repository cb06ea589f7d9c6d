"""The code blocks of README.md and docs/, and ways to run them as written.

``code_blocks(page)`` reads a page's fenced blocks. ``run_python`` executes a
block and ``run_sh`` runs one with bash, both after pointing the documented
address (``localhost:8000`` / ``127.0.0.1:8000``) at the server a test
started. A line's ``# → text`` comment is what the docs say it prints: both
runners check the output against these, in order, with ``…`` standing for
any text. ``tests/docs/test_code_blocks.py`` lists which test runs each page.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import REPO_ROOT

# The service's port (8000), and the FastAPI (8200) and Django (8300) examples' own.
DOCUMENTED_ADDRESSES = tuple(
    f"{host}:{port}" for port in (8000, 8200, 8300) for host in ("localhost", "127.0.0.1")
)
# A line of a fenced block that pymdownx.snippets replaces with a file, or a file's section,
# as the site shows it (mkdocs.yml: base_path is the repository root).
SNIPPET = re.compile(r'^-{1,}8<-{1,} "([^"]+)"\n', re.MULTILINE)
EXPECTED = re.compile(r"#\s*→\s*(.*)$")
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root, e.g. "docs/sdk.md"
    line: int  # of the opening fence
    lang: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def expected_output(self) -> list[str]:
        """The ``# → …`` comments of the block, in order."""
        return [match.group(1).strip() for line in self.code.splitlines() if (match := EXPECTED.search(line))]


def pages() -> list[str]:
    """Every documentation page: README.md and docs/**/*.md."""
    docs = sorted(str(path.relative_to(REPO_ROOT)) for path in (REPO_ROOT / "docs").rglob("*.md"))
    return ["README.md", *docs]


def included(code: str) -> str:
    """A block with its ``--8<-- "file"`` lines replaced by the file (the page shows the example)."""

    def content(match: re.Match[str]) -> str:
        name, _, part = match.group(1).partition(":")
        text = section(name, part) + "\n" if part else (REPO_ROOT / name).read_text(encoding="utf-8")
        return text if text.endswith("\n") else text + "\n"

    return SNIPPET.sub(content, code)


def code_blocks(page: str, lang: str | None = None) -> list[Block]:
    text = (REPO_ROOT / page).read_text(encoding="utf-8")
    blocks = [
        Block(page, text.count("\n", 0, match.start()) + 1, match.group(1), included(match.group(2)))
        for match in FENCE.finditer(text)
    ]
    return [block for block in blocks if lang is None or block.lang == lang]


def make_here(command: str) -> str:
    """A documented command's ``make`` calls, for this test run's virtualenv (``MAKEFLAGS=VENV=…``).

    Run as written when that virtualenv is this checkout's. When it belongs to another checkout
    (git worktrees sharing one ``.venv``), make must not reinstall the project: its
    ``pip install -e .`` would point every checkout's ``token-service`` at this one. ``-o``
    takes the install stamp as up to date, so make leaves the virtualenv alone, and
    ``PYTHONPATH`` makes what it starts import this checkout's code all the same.
    """
    if Path(sys.prefix).resolve().is_relative_to(REPO_ROOT.resolve()):
        return command
    here = f'export PYTHONPATH="{REPO_ROOT}${{PYTHONPATH:+:$PYTHONPATH}}"\n'
    return here + re.sub(r"\bmake(?= )", f"make -o {sys.prefix}/bin/token-service", command)


def shell_env(**extra: str) -> dict[str, str]:
    """This environment less its TOKEN_SERVICE_* settings, with the virtualenv's bin/ first on PATH."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("TOKEN_SERVICE_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


def pointed_at(code: str, base_url: str) -> str:
    """The block with the documented address replaced by the server's."""
    host_port = base_url.removeprefix("http://").removeprefix("https://")
    for address in DOCUMENTED_ADDRESSES:
        code = code.replace(address, host_port)
    return code


def matches(expected: str, actual: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.split("…"))
    return re.fullmatch(pattern, actual.strip()) is not None


def check_output(block: Block, output: str) -> None:
    expected = block.expected_output()
    if not expected:
        return
    actual = [line for line in output.splitlines() if line.strip()]
    assert len(actual) == len(expected), f"{block.where} says it prints {expected}, it printed {actual}"
    for want, got in zip(expected, actual, strict=True):
        assert matches(want, got), f"{block.where} says it prints {want!r}, it printed {got!r}"


def run_python(block: Block, namespace: dict[str, object], base_url: str | None = None) -> str:
    """exec the block in ``namespace`` (shared by a page's blocks); its stdout, checked."""
    code = pointed_at(block.code, base_url) if base_url else block.code
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        # dont_inherit: the block runs as a reader's own module would, without this file's
        # `from __future__ import annotations` (dataclasses and type hints see real types)
        exec(compile(code, block.where, "exec", dont_inherit=True), namespace)  # noqa: S102
    check_output(block, out.getvalue())
    return out.getvalue()


def run_sh(
    block: Block, base_url: str | None = None, env: Mapping[str, str] | None = None, timeout: float = 120
) -> str:
    """Run the block with ``bash -e``; its stdout, checked against its ``# →`` comments."""
    code = pointed_at(block.code, base_url) if base_url else block.code
    result = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, f"{block.where} failed ({result.returncode}): {result.stderr}"
    check_output(block, result.stdout)
    return result.stdout


def section(page: str, name: str) -> str:
    """The text between ``--8<-- [start:name]`` and ``[end:name]`` (what the site includes)."""
    text = (REPO_ROOT / page).read_text(encoding="utf-8")
    found = re.search(rf"\[start:{name}\][^\n]*\n(.*?)\n[^\n]*\[end:{name}\]", text, re.DOTALL)
    assert found, f"{page} has no section {name}"
    return found.group(1)
