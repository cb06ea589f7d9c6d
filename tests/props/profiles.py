"""Hypothesis settings profiles for the property tests.

Two profiles: ``props-ci`` (the default, what ``make test`` and CI run: 500
examples per backend) and ``props-quick`` (``PROPS_PROFILE=quick``, for a fast
local loop). They are applied to these tests only, never loaded globally, so
other areas' hypothesis tests keep their own settings.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = {
    "deadline": None,  # real redis-server round trips on a shared 2-core box vary
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much],
    "stateful_step_count": 30,
}
settings.register_profile("props-ci", max_examples=500, **_COMMON)  # type: ignore[arg-type]
settings.register_profile("props-quick", max_examples=50, **_COMMON)  # type: ignore[arg-type]


def props_settings() -> settings:
    return settings.get_profile("props-quick" if os.environ.get("PROPS_PROFILE") == "quick" else "props-ci")
