"""The SDK's modules import one way: the client builds guards, guards know no client class.

guard.py needs only an object with begin/renew/complete/fail (``GuardClient``),
so it imports nothing of ``_client`` — not even lazily inside a function — and
``_client`` imports guard at the top. (The two once imported each other lazily.)
"""

from __future__ import annotations

import ast

from tests.support.processes import REPO_ROOT

CLIENT = REPO_ROOT / "token_service" / "client"


def _imported_modules(path: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse((CLIENT / path).read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            names.add(("." * node.level) + (node.module or ""))
            names.update(("." * node.level) + alias.name for alias in node.names if not node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_guard_imports_no_client_module() -> None:
    imported = _imported_modules("guard.py")
    assert not {name for name in imported if name in ("._client", "token_service.client._client")}, imported


def test_the_guard_support_modules_import_neither_client_nor_guard() -> None:
    for module in ("_renewal.py", "_typed_results.py", "_telemetry.py"):
        imported = _imported_modules(module)
        mine = {name for name in imported if name.startswith((".", "token_service"))}
        assert not {name for name in mine if name.endswith(("_client", "guard"))}, (module, mine)
