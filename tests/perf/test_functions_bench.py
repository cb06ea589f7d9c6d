"""benchmarks.functions runs end to end (tiny sizes) and rewrites only its own section of RESULTS.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import functions

pytestmark = [pytest.mark.real, pytest.mark.slow]


def test_the_benchmark_runs_and_keeps_other_sections(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Someone else's section\n\nkept\n")
    functions.main(["--rounds", "3", "--calls", "5", "--out", str(tmp_path)])
    functions.main(["--rounds", "3", "--calls", "5", "--out", str(tmp_path)])  # replaces, not appends
    text = results.read_text()
    assert "## Someone else's section\n\nkept\n" in text
    assert text.count(functions.SECTION_START) == 1
    assert "| first execution |" in text
    assert "| replay |" in text
    assert (tmp_path / "functions.json").is_file()
