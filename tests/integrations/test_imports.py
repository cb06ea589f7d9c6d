"""Each integration imports without the other frameworks installed (they are optional extras),
and without the service's own dependencies (``idempotency-token-service[celery]`` installs no
Flask, httpx, ...)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.processes import REPO_ROOT

FRAMEWORKS = ("celery", "fastapi", "starlette", "django", "rest_framework", "flask", "uvicorn")
# the `server`, `client`, `db` and `telemetry` extras: none of them is needed by an integration
NOT_NEEDED = (
    "httpx",
    "marshmallow",
    "gevent",
    "gunicorn",
    "fakeredis",
    "prometheus_client",
    "pythonjsonlogger",
    "flask_cors",
    "sqlalchemy",
)
MODULES = {
    "token_service.client": (),
    "token_service.client.asgi": (),
    "token_service.client.keyed": (),
    "token_service.client.celery": ("celery",),
    "token_service.client.fastapi": ("fastapi", "starlette"),
    "token_service.client.django": ("django",),
}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_without_the_other_frameworks(module: str) -> None:
    missing = [name for name in (*FRAMEWORKS, *NOT_NEEDED) if name not in MODULES[module]]
    code = (
        "import sys\n"
        # a None entry makes `import name` raise ImportError, as if it were not installed
        f"for name in {missing!r}: sys.modules[name] = None\n"
        f"import {module}\n"
        f"assert not any(sys.modules.get(name) for name in {missing!r})\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
