"""benchmarks.sdk_http runs end to end in a tiny configuration (no speed is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import sdk_http

pytestmark = [pytest.mark.real, pytest.mark.slow]


def test_sdk_http_benchmark_measures_both_servers_in_alternating_rounds(tmp_path: Path) -> None:
    assert sdk_http.main(["--rounds", "2", "--calls", "5", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "sdk_http.json").read_text())
    assert len(result["rounds"]) == 2
    for measured in result["rounds"]:
        assert set(measured) == {"shipped", "sync"}
        assert all(ms > 0 for ms in measured.values())
    assert result["ratio"] == pytest.approx(sorted(result["ratios"])[0] / 2 + sorted(result["ratios"])[1] / 2)
