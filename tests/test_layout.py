"""The layers stay visible: core (token_service/*.py), client/, ops/ and server/ (docs/architecture.md).

Nothing imports upwards: core imports none of the others (nor a web
framework), the SDK neither ops/ nor the server, ops/ not the server. The
package refers to nothing outside the project; tests take shared values from
tests/support, not from a conftest; test files are named by behaviour, each
name once.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT

PACKAGE = REPO_ROOT / "token_service"
CORE = sorted(path for path in PACKAGE.glob("*.py") if path.name != "__init__.py")
CLIENT = sorted((PACKAGE / "client").rglob("*.py"))
OPS = sorted((PACKAGE / "ops").rglob("*.py"))
# the users' testing kit: the SDK on an in-memory store (docs/testing-your-code.md)
TESTING = sorted((PACKAGE / "testing").rglob("*.py"))
# the SDK's web-framework integrations import their framework, by design
FRAMEWORKS = {"flask", "django", "fastapi", "starlette", "celery"}


def imported(path: Path) -> set[str]:
    """Every module a file imports (at any depth: lazy imports count too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _ids(path: Path) -> str:
    return str(path.relative_to(PACKAGE))


def _imports_from(path: Path, *layers: str) -> set[str]:
    return {
        name for name in imported(path) if any(name.startswith(f"token_service.{layer}") for layer in layers)
    }


@pytest.mark.parametrize("path", CORE, ids=_ids)
def test_core_imports_no_layer_above_it(path: Path) -> None:
    assert _imports_from(path, "client", "ops", "server") == set()


@pytest.mark.parametrize("path", CLIENT, ids=_ids)
def test_the_sdk_imports_neither_the_operators_tools_nor_the_server(path: Path) -> None:
    assert _imports_from(path, "ops", "server") == set()


@pytest.mark.parametrize("path", TESTING, ids=_ids)
def test_the_testing_kit_stands_on_the_sdk_alone(path: Path) -> None:
    # what a backend with the client extra has: neither the server nor the operators' tools
    assert _imports_from(path, "ops", "server") == set()


@pytest.mark.parametrize("path", OPS, ids=_ids)
def test_the_operators_tools_never_import_the_server(path: Path) -> None:
    assert _imports_from(path, "server") == set()


# The SDK's private names ops/ reads its records with (token_service/ops/__init__.py says why)
OPS_PRIVATE_SDK = {
    ("token_service.client._idempotency_store", "digest"),
    ("token_service.client._idempotency_store", "read_earlier"),
    ("token_service.client._stored_response", "StoredResponse"),
    ("token_service.client.durable._guard", "database_now"),
    ("token_service.client.durable._schema", "IDEMPOTENCY_RECORDS"),
    ("token_service.client.durable._schema", "PROCESSING"),
}


def test_the_operators_tools_use_only_the_listed_private_names_of_the_sdk() -> None:
    used = set()
    for path in OPS:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("token_service.client"):
                private = any(part.startswith("_") for part in (node.module or "").split("."))
                used |= {(node.module, alias.name) for alias in node.names if private or alias.name[0] == "_"}
            elif isinstance(node, ast.Import):
                used |= {
                    (alias.name, "*")
                    for alias in node.names
                    if alias.name.startswith("token_service.client.")
                    and any(part.startswith("_") for part in alias.name.split("."))
                }
    assert used == OPS_PRIVATE_SDK


@pytest.mark.parametrize("path", CORE, ids=lambda path: path.name)
def test_core_imports_no_web_framework(path: Path) -> None:
    assert not {name for name in imported(path) if name.split(".")[0] in FRAMEWORKS | {"werkzeug"}}


def test_the_hot_path_and_its_operations_run_without_flask() -> None:
    # hot_path.py answers the two hottest routes below Flask; operations.py is the work it
    # shares with the Flask views (server/api.py), which must not be the way it reaches it
    server = PACKAGE / "server"
    hot_path, operations = imported(server / "hot_path.py"), imported(server / "operations.py")
    assert not {name for name in hot_path | operations if name.split(".")[0] == "flask"}
    assert not {name for name in operations if name.split(".")[0] == "werkzeug"}
    assert "token_service.server.api" not in hot_path | operations


def test_every_token_error_is_defined_in_the_error_tree_and_drawn_at_its_top() -> None:
    # one place for the error tree (token_service/errors.py), like httpx's _exceptions.py
    errors_py = PACKAGE / "errors.py"
    tree = ast.parse(errors_py.read_text(encoding="utf-8"))
    defined = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    elsewhere = [
        f"{path.relative_to(PACKAGE)}:{node.name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != errors_py
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef)
        and any(isinstance(base, ast.Name) and base.id in defined for base in node.bases)
    ]
    assert elsewhere == []
    drawn = ast.get_docstring(tree) or ""
    assert [name for name in sorted(defined) if not name.startswith("_") and f" {name} " not in drawn] == []


def test_the_package_root_exports_only_create_app_and_the_version() -> None:
    import token_service

    assert set(token_service.__all__) == {"__version__", "create_app"}
    tree = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    top_level_imports = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    assert all(
        node.module in {"__future__", "typing"}
        for node in top_level_imports
        if isinstance(node, ast.ImportFrom)
    )


def project_files() -> list[Path]:
    roots = ["token_service", "tests", "docs", "examples", "benchmarks", "lua", "deploy", "frontend"]
    files = [
        REPO_ROOT / name for name in ("README.md", "Makefile", "Dockerfile", "pyproject.toml", "openapi.yaml")
    ]
    for root in roots:
        files += [
            path
            for path in (REPO_ROOT / root).rglob("*")
            if path.is_file()
            and path.suffix in {".py", ".md", ".lua", ".yaml", ".yml", ".js", ".toml", ".html"}
            and "node_modules" not in path.parts
        ]
    return files


def test_nothing_refers_outside_the_project() -> None:
    outside = re.compile("SPEC" + r"\.md|\.\./" + "shared")  # split: this file must not match itself
    found = [
        str(path.relative_to(REPO_ROOT))
        for path in project_files()
        if outside.search(path.read_text(errors="replace"))
    ]
    assert found == []


def test_the_package_holds_no_benchmark_figures() -> None:
    # measured costs go stale in a comment: docs/performance.md keeps them, with the run they are from
    figure = re.compile(r"\b\d+(\.\d+)? ?(us|µs)\b|~ ?\d+(\.\d+)? ?%")
    found = [
        f"{path.relative_to(REPO_ROOT)}:{number}"
        for path in sorted([*PACKAGE.rglob("*.py"), *(REPO_ROOT / "lua").glob("*.lua")])
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if figure.search(line)
    ]
    assert found == []


TEST_FILES = sorted((REPO_ROOT / "tests").rglob("test_*.py"))


def test_tests_take_shared_values_from_tests_support() -> None:
    # any conftest, at any depth: a conftest is for fixtures; importing one as a module loads it twice
    pattern = re.compile(r"^\s*from tests(\.\w+)*\.conftest import|^\s*import tests(\.\w+)*\.conftest", re.M)
    found = [
        str(path.relative_to(REPO_ROOT))
        for path in (REPO_ROOT / "tests").rglob("*.py")
        if pattern.search(path.read_text())
    ]
    assert found == []


def test_test_files_have_names_of_their_own() -> None:
    seen: dict[str, list[str]] = {}
    for path in TEST_FILES:
        seen.setdefault(path.name, []).append(str(path.relative_to(REPO_ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_test_files_are_named_by_behaviour_not_by_event() -> None:
    event = re.compile(r"review|regression|fixup|issue_?\d|bug_?\d|followup", re.IGNORECASE)
    assert [path.name for path in TEST_FILES if event.search(path.stem)] == []


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Which of the package's modules each imports: at any depth, type-only imports included.

    ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``;
    relative imports are resolved. The implicit import of a parent package is not an edge.
    """
    paths = {_module_of(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges |= {alias.name for alias in node.names if alias.name in paths}
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                source = ".".join([*base, *([node.module] if node.module else [])])
                for alias in node.names:
                    if f"{source}.{alias.name}" in paths:
                        edges.add(f"{source}.{alias.name}")
                    elif source in paths:
                        edges.add(source)
        graph[module] = edges - {module}
    return graph


# The package root is the facade over every layer: create_app() forwards, lazily, to
# server/app.py, and the server reads the root's __version__ (the one source hatch and
# docs/deployment.md read). Its one upward edge is that forward, so it is left out here.
FACADE = "token_service"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_among_the_packages_modules() -> None:
    # store.py imports the codec (records.py) and never the reverse; records.py once imported
    # UseRequest from store.py for its types, closing limits -> records -> store -> limits
    graph = {module: edges - {FACADE} for module, edges in import_graph().items() if module != FACADE}
    assert cycles(graph) == []


def test_the_cycle_check_sees_a_type_only_import() -> None:
    # the check itself: the graph of the code before the codec held the request values
    graph = import_graph()
    assert "token_service.records" in graph["token_service.limits"]
    assert "token_service.limits" in graph["token_service.store"]
    graph["token_service.records"] = graph["token_service.records"] | {"token_service.store"}
    assert ["token_service.limits", "token_service.records", "token_service.store"] in cycles(graph)
