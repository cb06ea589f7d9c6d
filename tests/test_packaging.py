"""The wheel: what it carries (lua/, openapi.yaml, the browser helper; not benchmarks/), and
that the package runs from it as installed, reading its scripts and spec from inside itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT
from token_service import resources


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("hatchling", reason="hatchling builds the wheel")
    from hatchling.builders.wheel import WheelBuilder

    directory = tmp_path_factory.mktemp("wheel")
    built = WheelBuilder(str(REPO_ROOT)).build(directory=str(directory), versions=["standard"])
    return Path(next(iter(built)))


def test_the_wheel_carries_the_scripts_the_spec_and_the_helper(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for script in sorted((REPO_ROOT / "lua").glob("*.lua")):
        assert f"token_service/lua/{script.name}" in names
    assert "token_service/openapi.yaml" in names
    assert "token_service/frontend/token-client.js" in names


def test_the_wheel_carries_only_the_package(wheel: Path) -> None:
    top_level = {name.split("/", 1)[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {name for name in top_level if not name.endswith(".dist-info")} == {"token_service"}


def _metadata(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as opened:
        [name] = [name for name in opened.namelist() if name.endswith(".dist-info/METADATA")]
        return opened.read(name).decode().splitlines()


def test_the_wheel_ships_the_license_text(wheel: Path) -> None:
    # pyproject.toml said MIT, and no license text shipped (there was no LICENSE file)
    license_text = (REPO_ROOT / "LICENSE").read_text(encoding="utf-8")
    assert license_text.startswith("MIT License\n")
    assert "Copyright (c) 2026 token-service contributors" in license_text
    with zipfile.ZipFile(wheel) as opened:
        shipped = [name for name in opened.namelist() if ".dist-info/" in name and name.endswith("/LICENSE")]
        assert len(shipped) == 1, opened.namelist()
        assert opened.read(shipped[0]).decode() == license_text
    assert "License-Expression: MIT" in _metadata(wheel)


def test_the_metadata_names_the_project_urls(wheel: Path) -> None:
    from urllib.parse import urlsplit

    from token_service.problems import PROBLEM_TYPE_BASE

    urls = dict(
        line.removeprefix("Project-URL: ").split(", ", 1)
        for line in _metadata(wheel)
        if line.startswith("Project-URL: ")
    )
    assert urls["Problem types"] == PROBLEM_TYPE_BASE
    assert {urlsplit(url).netloc for url in urls.values()} == {urlsplit(PROBLEM_TYPE_BASE).netloc}
    assert all(url.startswith("https://") for url in urls.values())


def test_a_checkout_reads_the_top_level_files() -> None:
    assert resources.shipped("lua") == REPO_ROOT / "lua"
    assert resources.shipped("openapi.yaml") == REPO_ROOT / "openapi.yaml"
    assert resources.shipped("frontend") == REPO_ROOT / "frontend"


INSTALLED = """
import json, fakeredis
import token_service
from token_service import resources
from token_service.store import TokenStore
from token_service.records import IssueRequest, UseRequest

store = TokenStore(fakeredis.FakeRedis())
[token] = store.issue(IssueRequest("s", None, None, 60), 1)
consumed = store.consume(UseRequest(token, "s"))
app = token_service.create_app({"redis_client": fakeredis.FakeRedis(), "api_keys": "k" * 16})
spec = app.test_client().get("/openapi.yaml")
print(json.dumps({
    "package": token_service.__file__,
    "lua": str(resources.shipped("lua")),
    "replayed": consumed.replayed,
    "spec": spec.status_code,
}))
"""


def test_the_installed_package_reads_its_own_copies(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    zipfile.ZipFile(wheel).extractall(site)
    result = subprocess.run(
        [sys.executable, "-c", INSTALLED],
        # the unpacked wheel first on the path, ahead of the checkout's editable install
        env={**os.environ, "PYTHONPATH": str(site)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["package"].startswith(str(site))
    assert seen["lua"] == str(site / "token_service" / "lua")
    assert seen["replayed"] is False
    assert seen["spec"] == 200
