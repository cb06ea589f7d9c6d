"""The oldest redis-py that pyproject.toml allows still runs the store and the SDK.

The store's Redis calls use redis-py's connection layer directly
(``TokenStore._execute``), whose interface moved between releases: this runs
the token operations with the floor release (installed from PyPI into a
temporary folder, in front of the venv's newer one) against a real
redis-server.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT, RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.real]

SCRIPT = """
import sys
import redis
from token_service.client import TokenClient
from token_service.config import Settings
from token_service.connection import redis_client
from token_service.limits import IssuanceLimits
from token_service.store import TokenStore
from token_service.records import IssueRequest, UseRequest

assert redis.__version__.startswith(sys.argv[2] + "."), redis.__version__
client = redis_client(Settings.from_mapping({"redis_url": sys.argv[1]}))
store = TokenStore(client)
request = IssueRequest("payment.create", "user-1", None, 300)
tokens = store.issue(request, 3)
assert store.consume(UseRequest(tokens[0], "payment.create", "user-1", None, "r-1")).replayed is False
assert store.consume(UseRequest(tokens[0], "payment.create", "user-1", None, "r-1")).replayed is True
assert store._parked, "the parked connection is in use"
started = store.begin(UseRequest(tokens[1], "payment.create", "user-1", None, "r-2"), 30)
store.complete(tokens[1], started.lease_id, {"paid": True})
assert store.inspect(tokens[1]).result == {"paid": True}
limits = IssuanceLimits(None, 100)
assert len(store.admit_and_issue("ts:c:someone", limits, request, 2)) == 2
sdk = TokenClient.from_redis(sys.argv[1])
assert sdk.consume(tokens[2], "payment.create", subject="user-1").replayed is False
print("ok")
"""


def floor_version() -> str:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    for requirement in pyproject["project"]["dependencies"]:
        found = re.fullmatch(r"redis(\[[^]]*\])?>=(\d+\.\d+)", requirement)
        if found:
            return found.group(2)
    raise AssertionError("no redis>=X.Y requirement in pyproject.toml")


def test_the_oldest_allowed_redis_py_runs_the_token_operations(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    version = floor_version()
    target = tmp_path / "site"
    # with its own dependencies (PyJWT for 5.x), in front of the venv's packages
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), f"redis=={version}.*"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    if install.returncode != 0:
        message = f"could not install redis=={version}.* from PyPI: {install.stderr[-500:]}"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, redis_server.url, version],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": f"{target}{os.pathsep}{REPO_ROOT}"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"
