"""benchmarks.limiter (the Redis-side budget of the issuance limiter) runs end to end.

Quick mode: every row is measured and every ratio computed; no speed is asserted.
"""

from __future__ import annotations

import shutil

import pytest

from benchmarks import limiter

# slow: runs the limiter benchmark end to end in quick mode (~30 s)
pytestmark = pytest.mark.slow


@pytest.mark.skipif(
    shutil.which("redis-benchmark") is None,
    reason="redis-benchmark is not installed (apt-get install redis-tools)",
)
def test_quick_run_measures_every_row() -> None:
    result = limiter.run(limiter.Config.quick_mode())
    assert len(result["medians"]) == 9
    for row in result["medians"].values():
        assert min(row["rps"], row["cpu_us"], row["exec_us"]) > 0
    table = limiter.markdown(result)
    assert "generate rate / SET EX rate (>= 0.67)" in table
    assert all(value > 0 for value in result["budgets"].values())


def test_the_suite_keeps_the_limiter_section_of_results_md() -> None:
    from benchmarks.report import kept_sections, replace_section

    previous = replace_section("# Benchmark results\n\nold figures\n", "limiter", "## Limiter\n\n| a | b |")
    assert (
        kept_sections(previous)
        == "\n<!-- section: limiter -->\n## Limiter\n\n| a | b |\n<!-- end of section -->\n"
    )
    refreshed = replace_section(previous, "limiter", "## Limiter\n\n| c | d |")
    assert "| a | b |" not in refreshed
    assert refreshed.count("<!-- section: limiter -->") == 1


@pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("redis-benchmark", "valgrind", "callgrind_control")),
    reason="redis-benchmark or valgrind is not installed (apt-get install redis-tools valgrind)",
)
def test_instruction_counts_cover_every_row_and_the_function_variant() -> None:
    counted = limiter.instructions(requests=50, keyspace=1000)
    assert len(counted) == 10  # the nine rows and generate as a Redis Function
    assert all(value > 0 for value in counted.values())
    assert limiter.GENERATE_FCALL in counted
    assert "| generate: admit+issue, limits on |" in limiter.instructions_markdown(counted)
