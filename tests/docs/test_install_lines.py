"""Every install line names the distribution pyproject.toml builds, never ``token-service``.

``token-service`` on PyPI is another project (an Azure AD token service that also installs
a ``token_service`` package): ``pip install 'token-service[client]'`` installs it, says only
that it has no extra ``client``, and the SDK's import then fails. The docs, the package's
own messages and the deployment files say ``idempotency-token-service``; each extra they
name is one pyproject.toml has.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.support.docs import pages
from tests.support.processes import REPO_ROOT

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
DISTRIBUTION = PYPROJECT["project"]["name"]
EXTRAS = set(PYPROJECT["project"]["optional-dependencies"])
# someone else's distribution on PyPI: never a requirement of ours
TAKEN = "token-service"
# `token-service[` not preceded by a name character: the taken name with extras
TAKEN_WITH_EXTRAS = re.compile(r"(?<![\w.-])token[-_.]service\[")
# a requirement of ours with extras, however it is quoted
OURS_WITH_EXTRAS = re.compile(rf"(?<![\w.-]){re.escape(DISTRIBUTION)}\[([^\]]*)\]")
# pip's options that take the next argument as their value
TAKES_A_VALUE = {
    "-r", "--requirement", "-c", "--constraint", "-f", "--find-links", "-i", "--index-url",
    "--extra-index-url", "-t", "--target", "--prefix", "--root", "--cache-dir", "--python",
}  # fmt: skip
# `pip install <args>` up to the end of a line or of an inline code span
PIP_INSTALL = re.compile(r"pip3? install((?:[ \t]+[^\s`]+)+)")


def files() -> list[Path]:
    """What users and operators read or run: the docs, the package, the deployment files."""
    found = [REPO_ROOT / page for page in pages()]
    found += sorted((REPO_ROOT / "token_service").rglob("*.py"))
    found += sorted((REPO_ROOT / "examples").rglob("*.py"))
    found += sorted(path for path in (REPO_ROOT / "deploy").rglob("*") if path.is_file())
    for name in ("pyproject.toml", "Makefile", "Dockerfile", "docker-compose.yml"):
        if (REPO_ROOT / name).is_file():
            found.append(REPO_ROOT / name)
    return found


def _ids(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


def test_the_distribution_is_not_the_taken_name() -> None:
    assert DISTRIBUTION == "idempotency-token-service"
    assert PYPROJECT["project"]["scripts"] == {"token-service": "token_service.server.cli:main"}


@pytest.mark.parametrize("path", files(), ids=_ids)
def test_no_line_installs_the_taken_name(path: Path) -> None:
    text = path.read_text(encoding="utf-8", errors="replace")
    found = [
        f"{number}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), 1)
        if TAKEN_WITH_EXTRAS.search(line)
    ]
    assert found == []


@pytest.mark.parametrize("path", files(), ids=_ids)
def test_every_extra_named_is_one_pyproject_has(path: Path) -> None:
    text = path.read_text(encoding="utf-8", errors="replace")
    named = {
        extra.strip() for match in OURS_WITH_EXTRAS.finditer(text) for extra in match.group(1).split(",")
    }
    assert named - EXTRAS == set()


def requirements_installed(text: str) -> list[str]:
    """The requirement names of every `pip install` in the text (options and paths left out)."""
    names = []
    for match in PIP_INSTALL.finditer(text):
        arguments = iter(match.group(1).split())
        for argument in arguments:
            argument = argument.strip("'\"")
            if argument in TAKES_A_VALUE:
                next(arguments, None)
            elif not (argument.startswith("-") or "/" in argument or argument in {".", "&&", "|", ";", "\\"}):
                names.append(re.split(r"[\[<>=!~;@ ]", argument, maxsplit=1)[0])
    return names


@pytest.mark.parametrize("path", files(), ids=_ids)
def test_every_pip_install_of_the_project_names_the_distribution(path: Path) -> None:
    ours = [
        name
        for name in requirements_installed(path.read_text(encoding="utf-8", errors="replace"))
        if re.fullmatch(r"(\w+[-_.])?token[-_.]service", name, re.IGNORECASE)
    ]
    assert {name for name in ours if name != DISTRIBUTION} == set()


def test_the_checker_reads_the_lines_it_is_for() -> None:
    # the shapes the docs use, and the ones that must fail
    assert requirements_installed("`pip install 'idempotency-token-service[client]'`") == [DISTRIBUTION]
    assert requirements_installed("pip install --find-links dist 'idempotency-token-service[client]'\n") == [
        DISTRIBUTION
    ]
    assert requirements_installed("pip install --no-deps dist/x.whl") == []
    assert requirements_installed("pip install 'token-service[client]'") == [TAKEN]
    assert requirements_installed("pip install token-service") == [TAKEN]
    assert TAKEN_WITH_EXTRAS.search("(`pip install 'token-service[db]'`)")
    assert not TAKEN_WITH_EXTRAS.search("`pip install 'idempotency-token-service[db]'`")
    assert [m.group(1) for m in OURS_WITH_EXTRAS.finditer("'idempotency-token-service[fastapi,db]'")] == [
        "fastapi,db"
    ]
