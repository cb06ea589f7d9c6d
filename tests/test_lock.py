"""Reproducible installs: make, CI and the image install from requirements/*.lock, pinned and
hashed, and a lock older than pyproject.toml's dependencies stops `make install` saying so."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT

LOCK_SCRIPT = REPO_ROOT / "requirements" / "lock.py"


def lock_check(project: Path, locks: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(LOCK_SCRIPT), "check", "--project", str(project), "--locks", str(locks)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def pins(lock: Path) -> dict[str, str]:
    return dict(re.findall(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)", lock.read_text(), re.MULTILINE))


def test_the_locks_are_as_new_as_pyproject() -> None:
    result = lock_check(REPO_ROOT, REPO_ROOT / "requirements")
    assert result.returncode == 0, result.stderr


def test_a_dependency_added_without_a_new_lock_stops_the_install(tmp_path: Path) -> None:
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    assert '"redis[hiredis]>=5.3",' in pyproject
    (tmp_path / "pyproject.toml").write_text(
        pyproject.replace('"redis[hiredis]>=5.3",', '"redis[hiredis]>=5.3", "six",')
    )
    result = lock_check(tmp_path, REPO_ROOT / "requirements")
    assert result.returncode == 1
    assert "make lock" in result.stderr
    assert "requirements/dev.lock" in result.stderr


def test_a_missing_lock_stops_the_install(tmp_path: Path) -> None:
    shutil.copy(REPO_ROOT / "requirements" / "dev.lock", tmp_path / "dev.lock")
    result = lock_check(REPO_ROOT, tmp_path)
    assert result.returncode == 1
    assert "requirements/server.lock" in result.stderr


@pytest.mark.parametrize("name", ["dev.lock", "server.lock", "build.lock"])
def test_every_pin_is_exact_and_hashed(name: str) -> None:
    text = (REPO_ROOT / "requirements" / name).read_text()
    requirements = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 1)[1].split("\n", 2)[2])
    entries = [entry for entry in requirements if entry.strip() and not entry.startswith("#")]
    assert entries
    for entry in entries:
        assert "==" in entry.split("\\")[0], entry
        assert "--hash=sha256:" in entry, entry
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["name"]
    assert project not in pins(REPO_ROOT / "requirements" / name)  # the project installs with -e


@pytest.mark.parametrize("name", ["server.lock", "build.lock"])
def test_the_image_and_the_dev_install_agree_on_versions(name: str) -> None:
    # build.lock: the image's wheel is built by the hatchling the packaging tests build it with
    dev, image = pins(REPO_ROOT / "requirements" / "dev.lock"), pins(REPO_ROOT / "requirements" / name)
    assert image
    assert {name: version for name, version in image.items() if dev.get(name) != version} == {}


def test_the_build_lock_holds_the_build_backend() -> None:
    backend = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["build-system"]
    assert backend["build-backend"] == "hatchling.build"
    assert "hatchling" in pins(REPO_ROOT / "requirements" / "build.lock")


def test_make_and_the_image_install_from_the_locks() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "requirements/lock.py check" in makefile
    assert "pip install --quiet --require-hashes -r $(LOCK)" in makefile
    assert "pip install --quiet --no-deps -e ." in makefile
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    assert "pip install --require-hashes -r requirements/build.lock" in dockerfile
    assert "install --require-hashes --no-deps -r requirements/server.lock" in dockerfile
    # the wheel is built by the locked backend, not by one pip would fetch unpinned for isolation
    assert "wheel --no-deps --no-build-isolation" in dockerfile


def test_the_image_build_copies_every_file_the_wheel_needs() -> None:
    wheel = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"][
        "wheel"
    ]
    copied = [
        source
        for line in re.findall(r"^COPY (?!--from)(.+)$", (REPO_ROOT / "Dockerfile").read_text(), re.MULTILINE)
        for source in line.split()[:-1]  # every argument but the destination
    ]
    # LICENSE: hatchling ships it in the wheel's .dist-info when the build finds it
    for needed in [*wheel["packages"], *wheel.get("force-include", {}), "LICENSE"]:
        assert any(needed == source or needed.startswith(source.rstrip("/") + "/") for source in copied), (
            needed
        )
