"""Hypothesis settings profiles for the property tests.

- ``props-ci`` (the default: ``make test`` and CI): 500 examples per backend,
  derandomized — the same examples every run, so a CI failure always reproduces
  and the check that every interesting outcome was reached cannot flake.
- ``props-explore`` (``PROPS_PROFILE=explore``): 2000 random examples per backend,
  new ones each run, failures kept in hypothesis's example database; run it
  after touching lua/ or the model.
- ``props-quick`` (``PROPS_PROFILE=quick``): 50 random examples, a fast local loop.

They are applied to these tests only, never loaded globally, so other areas'
hypothesis tests keep their own settings.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = {
    "deadline": None,  # real redis-server round trips on a shared 2-core box vary
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much],
    "stateful_step_count": 30,
}
settings.register_profile("props-ci", max_examples=500, derandomize=True, **_COMMON)  # type: ignore[arg-type]
settings.register_profile("props-explore", max_examples=2000, **_COMMON)  # type: ignore[arg-type]
settings.register_profile("props-quick", max_examples=50, **_COMMON)  # type: ignore[arg-type]


def props_settings() -> settings:
    return settings.get_profile("props-" + os.environ.get("PROPS_PROFILE", "ci"))
