"""mkdocs hook: the HTTP API page from openapi.yaml (one source for the contract).

``openapi.yaml`` stays at the repository root; this hook copies it into the
site (so ``[openapi.yaml](openapi.yaml)`` resolves) and replaces the marker
``<!-- openapi-operations -->`` in a page with a table of every operation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from mkdocs.structure.files import File, Files

OPENAPI = Path(__file__).resolve().parents[1] / "openapi.yaml"
MARKER = "<!-- openapi-operations -->"
METHODS = ("get", "post", "put", "patch", "delete")


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "openapi.yaml", abs_src_path=str(OPENAPI)))
    return files


def operations_table(spec: dict[str, Any]) -> str:
    default_security = spec.get("security", [])
    rows = ["| method | path | what | service key | answers |", "|---|---|---|---|---|"]
    for path, item in spec["paths"].items():
        for method in METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            needs_key = "yes" if operation.get("security", default_security) else "no"
            statuses = ", ".join(str(status) for status in operation.get("responses", {}))
            summary = operation.get("summary", "").replace("|", "\\|")
            rows.append(f"| `{method.upper()}` | `{path}` | {summary} | {needs_key} | {statuses} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if MARKER not in markdown:
        return markdown
    spec = yaml.safe_load(OPENAPI.read_text(encoding="utf-8"))
    return markdown.replace(MARKER, operations_table(spec))
