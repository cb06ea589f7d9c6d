"""The SDK exports what its docs list, and nothing more (docs/sdk.md, "Public names").

A name in a module's ``__all__`` is a promise to users: the table there lists every
public module of ``token_service.client`` with its names, and each module's ``__all__``
must be exactly that row, both ways. A public module without a row fails too, so a new
one is either documented or private (``_name.py``).
"""

from __future__ import annotations

import importlib
import re

import pytest

from tests.support.processes import REPO_ROOT

SDK_PAGE = REPO_ROOT / "docs" / "sdk.md"
CLIENT = REPO_ROOT / "token_service" / "client"


def documented() -> dict[str, set[str]]:
    section = SDK_PAGE.read_text(encoding="utf-8").split("\n## Public names\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`token_service."):
            rows[cells[0].strip("`")] = set(re.findall(r"`([^`]+)`", cells[2]))
    return rows


def public_modules() -> list[str]:
    names = ["token_service.client"]
    for path in sorted(CLIENT.iterdir()):
        if path.name.startswith("_") or path.name == "__pycache__":
            continue
        if path.suffix == ".py" or (path / "__init__.py").exists():
            names.append(f"token_service.client.{path.stem}")
    return names


def test_every_public_module_of_the_sdk_has_a_row() -> None:
    assert sorted(documented()) == sorted(public_modules())


@pytest.mark.parametrize("module", public_modules())
def test_the_module_exports_exactly_its_documented_names(module: str) -> None:
    exported = set(importlib.import_module(module).__all__)
    listed = documented().get(module, set())
    assert {"exported, not documented": exported - listed, "documented, not exported": listed - exported} == {
        "exported, not documented": set(),
        "documented, not exported": set(),
    }


def test_the_package_teaches_about_25_names() -> None:
    # issue 32: what a user can hold in their head (48 names before)
    import token_service.client

    assert len(token_service.client.__all__) <= 26


def test_every_documented_name_is_there() -> None:
    missing = [
        f"{module}.{name}"
        for module, names in documented().items()
        for name in sorted(names)
        if not hasattr(importlib.import_module(module), name)
    ]
    assert missing == []


PACKAGE = REPO_ROOT / "token_service"


def _module_name(path: object) -> str:
    relative = path.relative_to(REPO_ROOT).with_suffix("")  # type: ignore[attr-defined]
    parts = list(relative.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted(_module_name(path) for path in PACKAGE.rglob("*.py"))


def test_every_module_of_the_package_declares_its_names() -> None:
    # a static check, so a module that needs an extra to import is read too
    without = [
        name
        for name, path in zip(MODULES, sorted(PACKAGE.rglob("*.py"), key=_module_name), strict=True)
        if not re.search(r"^__all__(: list\[str\])? = ", path.read_text(encoding="utf-8"), re.M)
    ]
    assert without == []


@pytest.mark.parametrize("module", MODULES)
def test_every_name_in_a_modules_all_exists(module: str) -> None:
    loaded = importlib.import_module(module)
    assert [name for name in loaded.__all__ if not hasattr(loaded, name)] == []
    assert len(set(loaded.__all__)) == len(loaded.__all__)
