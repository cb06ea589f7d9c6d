"""RetryPolicy's waits: an exponential ceiling, and equal jitter below it (as its docstring says)."""

from __future__ import annotations

import pytest

from token_service.client import RetryPolicy

CEILINGS = [(1, 0.05), (2, 0.1), (3, 0.2), (5, 0.8), (6, 1.0), (20, 1.0)]  # the default policy's


@pytest.mark.parametrize(("failures", "ceiling"), CEILINGS)
def test_each_wait_is_between_half_the_ceiling_and_the_ceiling(failures: int, ceiling: float) -> None:
    policy = RetryPolicy()
    waits = [policy.delay_seconds(failures) for _ in range(500)]
    assert all(ceiling / 2 - 1e-12 <= wait <= ceiling + 1e-12 for wait in waits)
    assert max(waits) - min(waits) > ceiling / 10  # jittered, not a fixed wait


def test_attempts_counts_the_first_try() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RetryPolicy(attempts=0)
