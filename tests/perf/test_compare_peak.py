"""The HTTP comparison's method: order swapped every round, the ratio paired within a round."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from benchmarks import suite
from benchmarks.load import WrkResult


class FakeRunner:
    """Answers run() from a script of req/s per (round, target); records the order asked."""

    def __init__(self, rates: list[dict[str, float]]) -> None:
        self.rates = rates
        self.calls: list[str] = []
        # the targets this runner has servers for (compare_peak skips the others)
        self.servers = SimpleNamespace(by_name={name: None for name in rates[0]})

    def run(self, target: str, endpoint: str, connections: int, seconds: float) -> WrkResult:
        round_number = sum(1 for t in self.calls if t == target)
        self.calls.append(target)
        rps = self.rates[round_number][target]
        return WrkResult(
            connections=connections,
            requests=int(rps * seconds),
            seconds=seconds,
            rps=rps,
            mean_ms=1.0,
            p50_ms=1.0,
            p90_ms=1.5,
            p99_ms=2.0,
            errors=0,
            server_cpu_ms=1000 / rps,
            redis_cpu_ms=0.1,
        )


def test_the_order_is_swapped_every_round_and_the_ratio_is_paired() -> None:
    # the machine slows down 3x after round 2: pairs still compare like with like
    rates = [
        {"service": 900.0, "baseline": 1000.0},
        {"service": 950.0, "baseline": 1000.0},
        {"service": 300.0, "baseline": 330.0},
        {"service": 290.0, "baseline": 330.0},
        {"service": 310.0, "baseline": 330.0},
    ]
    runner: Any = FakeRunner(rates)
    config = suite.Config(rounds=5)
    summary = suite.compare_peak(runner, config, "generate")
    assert runner.calls == ["service", "baseline", "baseline", "service"] * 2 + ["service", "baseline"]
    assert summary["round_ratios"] == [0.9, 0.95, 0.909, 0.879, 0.939]
    assert summary["ratio"] == rates[2]["service"] / rates[2]["baseline"]  # the median pair
    # the ratio of the two medians mixes rounds from before and after the slow-down
    assert summary["ratio_of_medians"] == 310.0 / 330.0
    assert summary["cpu_ratio"] == summary["ratio"]  # CPU per request = 1000 / rps here
