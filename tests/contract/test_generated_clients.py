"""The contract as tools read it: openapi.yaml linted, clients generated from it and run.

- Redocly (``@redocly/cli``) lints ``openapi.yaml`` with its ``recommended-strict`` rules;
- openapi-python-client (``--fail-on-warning``) and openapi-typescript generate a Python client
  and TypeScript types with the commands of docs/http-api.md, as written there;
- ``python_consumer.py`` (mypy ``--strict``) and ``consumer.ts`` (``tsc --strict``, with
  openapi-fetch) are backends written against them, run against the service under gunicorn on
  a real redis-server: the walk-through (generate, consume, the duplicate's 409 read through
  the generated ``Problem``), a 400's field errors, the two-phase flow (begin, complete, the
  stored result replayed) and an admin call.

So a change to openapi.yaml that breaks a generated client, or that the service does not keep,
fails here. The tools are pinned: ``package.json`` + ``package-lock.json`` (``npm ci``) and
``requirements.lock`` (hashed, in a virtualenv of its own: the generator pins ruff, typer and
pydantic ranges of its own), installed once into ``<virtualenv>/contract-tools/`` from the
registries. Without node/npm or the registries this skips, saying why; under ``CI`` it fails.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.docs import code_blocks
from tests.support.processes import REPO_ROOT, Gunicorn, RedisServer
from tests.support.service import API_KEY, service_env

# slow: npm ci and a virtualenv once per lock, then the generators, tsc and mypy (~1-2 min)
pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
PAGE = "docs/http-api.md"
TOOLS = Path(sys.prefix) / "contract-tools"
ADMIN_KEY = "admin-key-for-the-contract-tests-01"
SCOPE = "payment.create"
# The tools' own chatter off: no usage reports (Redocly's telemetry), no update checks.
QUIET = {
    "REDOCLY_TELEMETRY": "off",
    "REDOCLY_SUPPRESS_UPDATE_NOTICE": "true",
    "NO_COLOR": "1",
    "npm_config_update_notifier": "false",
    "npm_config_fund": "false",
    "npm_config_audit": "false",
}


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} — CI must run the contract tests", pytrace=False)
    pytest.skip(reason)


def _digest(*files: Path) -> str:
    hasher = hashlib.sha256()
    for path in files:
        hasher.update(path.read_bytes())
    return hasher.hexdigest()[:12]


@contextlib.contextmanager
def _installing() -> Iterator[None]:
    """One install at a time into TOOLS (two test runs of one virtualenv may start together)."""
    TOOLS.mkdir(parents=True, exist_ok=True)
    with (TOOLS / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    result = subprocess.run(
        args,
        cwd=cwd,
        env={**os.environ, **QUIET, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(args)} (exit {result.returncode}):\n{output}"
    return output


@pytest.fixture(scope="module")
def npm_project() -> Path:
    """``npm ci`` of package-lock.json, once per lock: Redocly, openapi-typescript, openapi-fetch, tsc."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            _unavailable(f"{tool} is missing, which the contract tests need (apt-get install nodejs npm)")
    project = TOOLS / f"npm-{_digest(HERE / 'package.json', HERE / 'package-lock.json')}"
    done = project / "node_modules" / ".installed"
    with _installing():
        if not done.exists():
            shutil.rmtree(project, ignore_errors=True)
            project.mkdir(parents=True)
            for name in ("package.json", "package-lock.json"):
                shutil.copy(HERE / name, project / name)
            result = subprocess.run(
                ["npm", "ci", "--cache", str(TOOLS / "npm-cache")],
                cwd=project,
                env={**os.environ, **QUIET},
                capture_output=True,
                text=True,
                timeout=900,
            )
            if result.returncode != 0:
                _unavailable(
                    "npm ci of tests/contract/package-lock.json failed (no registry?): "
                    + result.stderr[-2000:]
                )
            done.touch()
    return project


@pytest.fixture(scope="module")
def python_generator() -> Path:
    """openapi-python-client from requirements.lock in a virtualenv of its own; its bin/."""
    venv = TOOLS / f"openapi-python-client-{_digest(HERE / 'requirements.lock')}"
    done = venv / ".installed"
    with _installing():
        if not done.exists():
            shutil.rmtree(venv, ignore_errors=True)
            _run([sys.executable, "-m", "venv", str(venv)], TOOLS)
            result = subprocess.run(
                [
                    str(venv / "bin" / "pip"),
                    "install",
                    "--quiet",
                    "--require-hashes",
                    "-r",
                    str(HERE / "requirements.lock"),
                ],
                capture_output=True,
                text=True,
                timeout=900,
            )
            if result.returncode != 0:
                _unavailable(
                    "pip could not install tests/contract/requirements.lock (no registry?): "
                    + result.stderr[-2000:]
                )
            done.touch()
    return venv / "bin"


@pytest.fixture(scope="module")
def workdir(npm_project: Path) -> Iterator[Path]:
    """A fresh directory with openapi.yaml, inside the npm project (so `npx` finds its pinned tools)."""
    work = npm_project / "runs" / uuid.uuid4().hex[:12]
    work.mkdir(parents=True)
    shutil.copy(REPO_ROOT / "openapi.yaml", work / "openapi.yaml")
    yield work
    shutil.rmtree(work, ignore_errors=True)


def _the_pages_blocks() -> tuple[str, str, str]:
    """docs/http-api.md's generator config (its file name on its first line) and its commands."""
    [config] = code_blocks(PAGE, "yaml")
    [commands] = code_blocks(PAGE, "sh")
    name = re.fullmatch(r"# (\S+)", config.code.splitlines()[0])
    assert name, f"{config.where}: the first line names the file (# openapi-python-client.yaml)"
    return name.group(1), config.code, commands.code


@pytest.fixture(scope="module")
def generated(workdir: Path, python_generator: Path) -> str:
    """The page's two commands, as written, in ``workdir``: what they printed."""
    config_name, config, commands = _the_pages_blocks()
    (workdir / config_name).write_text(config, encoding="utf-8")
    env = {
        # the pinned generator (and the ruff it formats with) first; npx finds the project's
        # openapi-typescript, and offline it can never fetch another
        "PATH": f"{python_generator}{os.pathsep}{os.environ['PATH']}",
        "npm_config_offline": "true",
        "npm_config_cache": str(TOOLS / "npm-cache"),
    }
    return _run(["bash", "-euo", "pipefail", "-c", commands], workdir, env)


@pytest.fixture(scope="module")
def service(redis_server: RedisServer) -> Iterator[dict[str, str]]:
    env = service_env(
        redis_server.url, TOKEN_SERVICE_ADMIN_KEYS=ADMIN_KEY, TOKEN_SERVICE_KEY_PREFIX="contract-tests:"
    )
    server = Gunicorn(env, workers=1).start()
    try:
        yield {
            "TOKEN_SERVICE_URL": server.url,
            "TOKEN_SERVICE_API_KEY": API_KEY,
            "TOKEN_SERVICE_ADMIN_KEY": ADMIN_KEY,
        }
    finally:
        server.stop()


# -- the document -------------------------------------------------------------------------------


def test_redocly_recommended_strict_finds_nothing(workdir: Path) -> None:
    output = _run(["npx", "redocly", "lint", "--extends", "recommended-strict", "openapi.yaml"], workdir)
    print(output)
    assert "Your API description is valid" in output, output
    assert not re.search(r"\b\d+ (errors?|warnings?)\b", output), output


def test_the_generators_run_clean_with_the_pages_commands(generated: str, workdir: Path) -> None:
    print(generated)
    assert "Warning" not in generated, generated  # --fail-on-warning exits 1 on one, too
    assert (workdir / "token_service_client" / "client.py").is_file()
    assert (workdir / "token-service.d.ts").is_file()


# -- the Python client --------------------------------------------------------------------------


def _python_consumer(workdir: Path) -> Path:
    consumer = workdir / "python_consumer.py"
    shutil.copy(HERE / "python_consumer.py", consumer)
    return consumer


def test_the_python_client_type_checks_strict(generated: str, workdir: Path) -> None:
    consumer = _python_consumer(workdir)
    mypy = [
        sys.executable,
        "-m",
        "mypy",
        "--strict",
        "--warn-unused-ignores",
        "--no-incremental",
        consumer.name,
    ]
    output = _run(mypy, workdir, {"MYPYPATH": str(workdir)})
    print(output)
    assert "Success: no issues found" in output


def test_the_python_client_against_the_service(
    generated: str, workdir: Path, service: dict[str, str]
) -> None:
    consumer = _python_consumer(workdir)
    seen = json.loads(_run([sys.executable, consumer.name], workdir, {**service, "PYTHONPATH": str(workdir)}))
    walk = seen["walk_through"]
    assert walk["issued"] == {
        "token_chars": walk["issued"]["token_chars"],
        "ttl_seconds": 300,
        "subject": "shopper-1",
    }
    assert walk["issued"]["token_chars"] >= 22
    assert walk["consumed"] == {"outcome": "consumed", "replayed": False}
    assert walk["retry"] == {"outcome": "consumed", "replayed": True}
    duplicate = walk["duplicate"]
    assert duplicate["http_status"] == duplicate["status"] == 409
    assert duplicate["code"] == "token_used"
    assert duplicate["is_token_used"] is True
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", duplicate["token_ref"])
    assert re.fullmatch(r"[A-Za-z0-9._:-]{1,128}", duplicate["request_id"])
    assert seen["field_errors"]["http_status"] == 400
    assert seen["field_errors"]["code"] == "invalid_request"
    assert list(seen["field_errors"]["errors"]) == ["scope"]
    assert all(isinstance(message, str) for message in seen["field_errors"]["errors"]["scope"])
    assert seen["two_phase"]["started"]["outcome"] == "started"
    assert 0 < seen["two_phase"]["started"]["lease_seconds"] <= 30
    assert seen["two_phase"]["completed"] == {"outcome": "succeeded", "replayed": False}
    assert seen["two_phase"]["replay"] == {
        "outcome": "succeeded",
        "replayed": True,
        "result": {"charge": "ch_7", "amount_cents": 1250},
    }
    assert seen["admin"] == {
        "kind": "token",
        "ref": duplicate["token_ref"],
        "state": "CONSUMED",
        "is_consumed": True,
        "scope": SCOPE,
        "request_id": "order-1",
    }
    assert seen["unauthenticated"] == {"http_status": 401, "code": "unauthorized"}
    served = (REPO_ROOT / "openapi.yaml").read_text(encoding="utf-8")
    assert seen["document"] == {"starts": "openapi: 3.1.0", "chars": len(served)}


# -- the TypeScript types -----------------------------------------------------------------------

TSCONFIG = {
    "compilerOptions": {
        "strict": True,
        "noEmitOnError": True,
        "skipLibCheck": False,
        "target": "es2022",
        "module": "nodenext",
        "moduleResolution": "nodenext",
        "types": ["node"],
        "outDir": "out",
    },
    "files": ["consumer.ts"],
}


@pytest.fixture(scope="module")
def compiled(generated: str, workdir: Path) -> str:
    """consumer.ts compiled by the pinned tsc, --strict: what tsc printed (nothing when clean)."""
    shutil.copy(HERE / "consumer.ts", workdir / "consumer.ts")
    (workdir / "tsconfig.json").write_text(json.dumps(TSCONFIG), encoding="utf-8")
    return _run(["npx", "tsc", "--project", "tsconfig.json"], workdir, {"npm_config_offline": "true"})


def test_the_typescript_types_compile_strict(compiled: str, workdir: Path) -> None:
    assert compiled.strip() == "", compiled
    assert (workdir / "out" / "consumer.js").is_file()
    version = _run(["npx", "tsc", "--version"], workdir, {"npm_config_offline": "true"})
    print(f"tsc --strict consumer.ts against token-service.d.ts: clean ({version.strip()})")


def test_the_typescript_client_against_the_service(
    compiled: str, workdir: Path, service: dict[str, str]
) -> None:
    seen: dict[str, Any] = json.loads(_run(["node", "out/consumer.js"], workdir, service))
    walk = seen["walk_through"]
    assert walk["consumed"] == {"outcome": "consumed", "replayed": False}
    duplicate = walk["duplicate"]
    assert duplicate["http_status"] == duplicate["status"] == 409
    assert (duplicate["code"], duplicate["is_token_used"]) == ("token_used", True)
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", duplicate["token_ref"])
    assert re.fullmatch(r"[A-Za-z0-9._:-]{1,128}", duplicate["request_id"])
    errors = seen["field_errors"]
    assert (errors["http_status"], errors["code"], list(errors["errors"])) == (
        400,
        "invalid_request",
        ["scope"],
    )
    assert errors["first"] == errors["errors"]["scope"][0]
    assert seen["two_phase"]["started"]["outcome"] == "started"
    assert seen["two_phase"]["completed"] == {"outcome": "succeeded", "replayed": False}
    assert seen["two_phase"]["replay"]["result"] == {"charge": "ch_7", "amount_cents": 1250}
    assert seen["admin"] == {
        "kind": "token",
        "ref": duplicate["token_ref"],
        "state": "CONSUMED",
        "is_consumed": True,
        "scope": SCOPE,
        "request_id": "order-1",
        "stored_status": None,
    }
