"""The Spin model of the lease protocol (lua/model/lease.pml) and the tools that check it."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.support.processes import REPO_ROOT

MODEL = REPO_ROOT / "lua" / "model" / "lease.pml"


def tool(name: str) -> str:
    """The path of ``spin`` or ``gcc``; the test skips without it, except under CI, where it fails."""
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed (.ci/run installs Debian's spin and gcc)", pytrace=False)
        pytest.skip(f"{name} is not installed: the model check needs it (apt-get install spin gcc)")
    return found
