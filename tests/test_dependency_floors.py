"""The oldest releases pyproject.toml allows for the service's and the SDK's dependencies
still pass the tests that use them.

Each ``name>=X`` of the ``server``, ``client`` and ``telemetry`` extras is installed at
exactly X (from the package index, into a temporary folder, with what each of them
requires, as a user's install would resolve it; redis-py held at the venv's release) and
put in front of the venv; then a focused set of tests runs on them in a subprocess: the HTTP API
(Flask, marshmallow) on the embedded store (fakeredis with Lua), CORS (flask-cors),
metrics and JSON logs (prometheus-client, python-json-logger), the SDK's HTTP transport
(httpx) and its telemetry (OpenTelemetry). The floors of redis-py and of gunicorn and gevent
have their own tests (tests/test_redis_py_minimum.py, tests/edge/test_gunicorn_floor.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import redis

from tests.support.processes import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.real]

EXTRAS = ("server", "client", "telemetry")
HAS_OWN_TEST = {"gunicorn", "gevent"}
TESTS = [
    "tests/test_api.py",
    "tests/edge/test_cors.py",
    "tests/edge/test_telemetry.py",
    "tests/client/test_client.py",
    "tests/client/test_telemetry.py",
]


def floors() -> dict[str, str]:
    """name → X for every ``name[extras]>=X`` of the extras above."""
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    found: dict[str, str] = {}
    for extra in EXTRAS:
        for requirement in pyproject["project"]["optional-dependencies"][extra]:
            match = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?>=([\w.]+)", requirement)
            assert match, f"{extra}: {requirement!r} is not name>=floor"
            if match.group(1) not in HAS_OWN_TEST:
                found[match.group(1)] = match.group(2)
    return found


def test_every_floor_is_pinned_as_name_at_least_version() -> None:
    assert {"flask", "marshmallow", "fakeredis", "flask-cors", "httpx"} <= floors().keys()


def test_the_tests_pass_on_the_floor_releases(tmp_path: Path) -> None:
    wanted = floors()
    target = tmp_path / "floors"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target)]
        + [f"{name}=={version}" for name, version in sorted(wanted.items())]
        + [f"redis=={redis.__version__}"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        message = f"could not install the floors {wanted}: {done.stderr[-800:]}"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(REPO_ROOT)])}
    check = (
        "import sys\n"
        "from importlib.metadata import version\n"
        "from packaging.version import Version\n"
        "for name, floor in (arg.split('=') for arg in sys.argv[1:]):\n"
        "    assert Version(version(name)) == Version(floor), (name, version(name), floor)\n"
    )
    versions = [f"{name}={version}" for name, version in wanted.items()]
    imported = subprocess.run(
        [sys.executable, "-c", check, *versions], env=env, capture_output=True, text=True, timeout=60
    )
    assert imported.returncode == 0, imported.stderr
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *TESTS],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert run.returncode == 0, f"on the floors {versions}:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"
