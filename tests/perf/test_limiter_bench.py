"""benchmarks.limiter (the Redis-side budget of the issuance limiter) runs end to end.

Quick mode: every row is measured and every ratio computed; no speed is asserted.
"""

from __future__ import annotations

import shutil

import pytest

from benchmarks import limiter


@pytest.mark.skipif(shutil.which("redis-benchmark") is None, reason="redis-benchmark is not installed")
def test_quick_run_measures_every_row() -> None:
    result = limiter.run(limiter.Config.quick_mode())
    assert len(result["medians"]) == 6
    for row in result["medians"].values():
        assert min(row["rps"], row["cpu_us"], row["exec_us"]) > 0
    table = limiter.markdown(result)
    assert "generate rate / SET EX rate (>= 0.67)" in table
    assert all(value > 0 for value in result["budgets"].values())
