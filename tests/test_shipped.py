"""What we ship, installed as users install it, runs: the wheel, the sdist and the server lock.

``python -m build`` makes the sdist and the wheel once for this module (the wheel is built
from the sdist, so the sdist holds what a build needs); ``twine check`` accepts both. Then,
each in a fresh venv created here and removed afterwards:

- **a server host** (docs/install.md's block, run as written but for its paths):
  ``requirements/server.lock`` with ``--require-hashes`` and the wheel with ``--no-deps``;
  ``token-service serve`` on its default worker class (gevent) against a real redis-server
  answers the README's walk-through (200, 409, 200 replayed). This is what the image and
  a host without Docker run: with gunicorn's gevent worker missing ``packaging`` it
  exited at start, while the dev install, which has ``packaging`` through pytest, passed.
- **a backend**: the wheel with its ``client`` extra from the package index
  (docs/install.md's line), holding no Flask, gunicorn or gevent, runs the README's SDK
  snippet against that service.
- **a user's own project** (an app and its tests in a folder of their own, no conftest):
  with pytest added to that backend's venv, its suite runs on the testing kit's fixtures
  (``token_client``, ``token_clock``, ``token_faults``: the ``pytest11`` entry point) with
  no Redis anywhere, and passes.
- **the sdist**, installed by pip (which builds it), serves the walk-through too.

Installing from the package index needs the network: without it these tests skip
(fail under CI). Venvs use pip's cache, so a second run downloads nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

import token_service
from tests.support.docs import code_blocks, pointed_at, run_sh, section
from tests.support.processes import REPO_ROOT, RedisServer, free_port, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.real, pytest.mark.timeout(900)]

PAGE = "docs/install.md"
# how the page names the checkout; the tests put a real path in its place
CHECKOUT = "~/src/token-service"
DISTRIBUTION = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["name"]
# the Makefile's development key: the README's walk-through and SDK snippet send it as written. On
# the real Redis these servers run on it is refused unless the environment says development.
README_KEY = "dev-service-key-change-me"
DEVELOPMENT = {"TOKEN_SERVICE_ENVIRONMENT": "development"}
# what only the server extra brings: a backend with the client extra has none of it (fakeredis
# and lupa it has: the testing kit runs the scripts on them in the backend's own tests)
SERVER_ONLY = {"flask", "werkzeug", "gunicorn", "gevent", "greenlet", "marshmallow"}
TESTING_KIT = {"fakeredis", "lupa"}
# the files the package reads at run time, at their place inside the installed package
RUNTIME_FILES = (
    "token_service/openapi.yaml",
    "token_service/frontend/token-client.js",
    "token_service/py.typed",
)


@dataclass(frozen=True)
class Built:
    sdist: Path
    wheel: Path


def run(
    args: list[str], *, cwd: Path = REPO_ROOT, env: Mapping[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def from_the_index(done: subprocess.CompletedProcess[str], what: str) -> None:
    """An install that reaches the package index: skip without it, but fail under CI."""
    if done.returncode == 0:
        return
    message = f"{what} failed ({done.returncode}): {done.stdout[-1500:]}\n{done.stderr[-3000:]}"
    unreachable = re.search(
        r"NewConnectionError|Temporary failure in name resolution|Network is unreachable", done.stderr
    )
    if unreachable and not os.environ.get("CI"):
        pytest.skip(f"the package index is unreachable: {message}")
    pytest.fail(message, pytrace=False)


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without the project's settings, the checkout on sys.path or this venv."""
    dropped = ("TOKEN_SERVICE_", "GUNICORN_", "WEB_CONCURRENCY", "PYTHONPATH", "VIRTUAL_ENV")
    env = {key: value for key, value in os.environ.items() if not key.startswith(dropped)}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(part for part in env.get("PATH", "").split(os.pathsep) if part != venv_bin)
    return {**env, **extra}


def distributions(venv: Path) -> set[str]:
    listed = run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"], env=clean_env())
    assert listed.returncode == 0, listed.stderr
    return {entry["name"].lower().replace("_", "-") for entry in json.loads(listed.stdout)}


def block(number: int) -> str:
    return code_blocks(PAGE, "sh")[number].code


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    """One folder for this module's builds and venvs (a few hundred MB), removed at the end."""
    folder = Path(tempfile.mkdtemp(prefix="ts-shipped-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def built(scratch: Path) -> Built:
    """The build docs/install.md's first block makes, with the locked hatchling (no isolation).

    (test_the_build_block_runs_as_written runs the block itself.)"""
    assert ".venv-build/bin/python -m build" in block(0)
    out = scratch / "dist"
    # --no-isolation: the build backend from requirements/dev.lock, not the newest from the index
    done = run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO_ROOT)])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [sdist] = out.glob("*.tar.gz")
    [wheel] = out.glob("*.whl")
    return Built(sdist, wheel)


# --- the artifacts ------------------------------------------------------------------------------


def test_the_wheel_and_the_sdist_are_named_and_versioned_as_pyproject_says(built: Built) -> None:
    version = token_service.__version__
    stem = DISTRIBUTION.replace("-", "_")
    assert built.wheel.name == f"{stem}-{version}-py3-none-any.whl"
    assert built.sdist.name == f"{stem}-{version}.tar.gz"
    with zipfile.ZipFile(built.wheel) as wheel:
        metadata = wheel.read(f"{stem}-{version}.dist-info/METADATA").decode()
    assert f"\nName: {DISTRIBUTION}\n" in metadata
    assert f"\nVersion: {version}\n" in metadata


def test_the_version_has_one_source() -> None:
    # __version__ is the source (hatchling reads it); the copies the contract and the
    # browser helper's package carry are held to it here
    assert tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dynamic"] == ["version"]
    spec = yaml.safe_load((REPO_ROOT / "openapi.yaml").read_text(encoding="utf-8"))
    assert spec["info"]["version"] == token_service.__version__
    package = json.loads((REPO_ROOT / "frontend" / "package.json").read_text(encoding="utf-8"))
    assert package["version"] == token_service.__version__
    changelog = (REPO_ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"## [{token_service.__version__}]" in changelog


def test_twine_accepts_both(built: Built) -> None:
    done = run([sys.executable, "-m", "twine", "check", "--strict", str(built.sdist), str(built.wheel)])
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 2, done.stdout


def externally_managed_python3() -> Path | None:
    """Debian's own python3 when it refuses ``pip install`` outside a venv (PEP 668) and has venv."""
    python3 = Path("/usr/bin/python3")
    if not python3.exists():
        return None
    probe = "import ensurepip, sysconfig, venv; print(sysconfig.get_path('stdlib'))"
    done = run([str(python3), "-c", probe], env=clean_env())
    if done.returncode != 0 or not (Path(done.stdout.strip()) / "EXTERNALLY-MANAGED").is_file():
        return None
    return python3


def copy_of_the_checkout(target: Path) -> Path:
    """What a build reads of the checkout: pyproject.toml and the sdist's include list."""
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    included = pyproject["tool"]["hatch"]["build"]["targets"]["sdist"]["include"]
    for entry in ["/pyproject.toml", *included]:
        source, copy = REPO_ROOT / entry.lstrip("/"), target / entry.lstrip("/")
        if source.is_dir():
            shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy)
    return target


def test_the_build_block_runs_as_written(scratch: Path) -> None:
    """docs/install.md's build, as written, on a python3 that PEP 668 guards (Debian's, Ubuntu's).

    Its old first line, ``python3 -m pip install build``, stops there with
    ``error: externally-managed-environment``; the block now makes a venv first.
    """
    python3 = externally_managed_python3()
    if python3 is None:
        message = "no externally managed /usr/bin/python3 with venv (apt-get install python3-venv)"
        if os.environ.get("CI"):
            pytest.fail(message + " — CI must run it", pytrace=False)
        pytest.skip(message)
    checkout = copy_of_the_checkout(scratch / "checkout")
    bin_dir = scratch / "pep668-bin"  # `python3` on PATH is Debian's
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(python3)
    refused = run([str(bin_dir / "python3"), "-m", "pip", "install", "build"], env=clean_env(), cwd=scratch)
    assert refused.returncode != 0
    assert "externally-managed-environment" in refused.stdout + refused.stderr
    env = clean_env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    done = run(["bash", "-e", "-c", block(0).replace(CHECKOUT, str(checkout))], env=env, cwd=scratch)
    from_the_index(done, "the build block")
    assert sorted(path.name for path in (checkout / "dist").iterdir()) == [
        f"{DISTRIBUTION.replace('-', '_')}-{token_service.__version__}{suffix}"
        for suffix in ("-py3-none-any.whl", ".tar.gz")
    ]


def test_the_wheel_ships_the_type_marker_and_the_runtime_files(built: Built) -> None:
    names = set(zipfile.ZipFile(built.wheel).namelist())
    assert set(RUNTIME_FILES) <= names
    assert {f"token_service/lua/{lua.name}" for lua in (REPO_ROOT / "lua").glob("*.lua")} <= names


def test_the_sdist_holds_what_a_build_and_a_server_host_need(built: Built) -> None:
    with tarfile.open(built.sdist) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    needed = {
        "pyproject.toml",
        "README.md",
        "CHANGELOG.md",
        "LICENSE",
        "openapi.yaml",
        "frontend/token-client.js",
    }
    needed |= {"requirements/server.lock", "token_service/__init__.py", "token_service/py.typed"}
    needed |= {f"lua/{lua.name}" for lua in (REPO_ROOT / "lua").glob("*.lua")}
    assert needed <= names
    # the package and what builds it, not the repository: no tests, benchmarks, node_modules, venvs
    top_level = {name.split("/", 1)[0] for name in names}
    assert top_level <= {
        "token_service",
        "lua",
        "frontend",
        "requirements",
        *needed,
        "PKG-INFO",
        ".gitignore",
    }


# --- installed as users install it --------------------------------------------------------------


@dataclass(frozen=True)
class Served:
    url: str
    venv: Path
    log: Path


def serve_line() -> str:
    """The `token-service serve` command of the server-host block (its continuation joined)."""
    text = block(2).replace("\\\n", " ")
    [line] = [line for line in text.splitlines() if " serve " in line]
    return line


@pytest.fixture(scope="module")
def served(built: Built, scratch: Path, redis_server: RedisServer) -> Iterator[Served]:
    """docs/install.md's server host: a venv from the server lock and the wheel, serving."""
    venv = scratch / "server-venv"
    install = "\n".join(line for line in block(2).replace("\\\n", " ").splitlines() if " serve " not in line)
    assert f"--require-hashes -r {CHECKOUT}/requirements/server.lock" in install
    assert f"--no-deps {CHECKOUT}/dist/" in install
    install = install.replace("/opt/token-service", str(venv)).replace(
        f"{CHECKOUT}/dist/", f"{built.wheel.parent}/"
    )
    install = install.replace(CHECKOUT, str(REPO_ROOT))
    # python3 is the machine's, not this test run's venv (clean_env drops it from PATH)
    done = run(["bash", "-e", "-o", "pipefail", "-c", install], env=clean_env())
    from_the_index(done, "the server host's install")
    port = free_port()
    command = serve_line().replace("/opt/token-service", str(venv))
    command = command.replace("redis://127.0.0.1:6379/0", redis_server.url)
    command = command.replace("a-long-random-service-key", README_KEY)
    command = command.replace("--host 0.0.0.0", "--host 127.0.0.1").replace("--port 8000", f"--port {port}")
    log = scratch / "serve.log"
    # two workers whatever the machine's cores; cwd outside the checkout, so nothing of it is imported
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["bash", "-c", command],
            cwd=scratch,
            env=clean_env(WEB_CONCURRENCY="2", **DEVELOPMENT),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: process.poll() is not None or healthy(url), 120, 0.1, what="serve from the lock")
        assert process.poll() is None, f"serve exited {process.returncode}: {log.read_text()[-3000:]}"
        yield Served(url, venv, log)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def healthy(url: str) -> bool:
    return httpx.get(url + "/healthz", timeout=1).status_code == 200


def walk_through(url: str) -> None:
    """The README's walk-through, as written, against the service at ``url``."""
    walkthrough = code_blocks("README.md", "sh")[1]
    assert walkthrough.code in section("README.md", "walkthrough")
    output = run_sh(walkthrough, base_url=url).splitlines()
    assert output[0] == '{"outcome":"consumed","replayed":false} 200'
    assert output[1].endswith(" 409")
    assert '"code":"token_used"' in output[1]
    assert output[2] == '{"outcome":"consumed","replayed":true} 200'


def test_the_server_lock_and_the_wheel_serve_the_walkthrough(served: Served) -> None:
    walk_through(served.url)
    installed = distributions(served.venv)
    assert {DISTRIBUTION, "flask", "gunicorn", "gevent", "packaging"} <= installed
    python = str(served.venv / "bin" / "python")
    checked = run([python, "-m", "pip", "check"], env=clean_env())
    assert checked.returncode == 0, checked.stdout + checked.stderr
    where = run(
        [python, "-c", "import token_service; print(token_service.__file__)"],
        env=clean_env(),
        cwd=served.venv,
    )
    assert where.stdout.startswith(str(served.venv)), where
    version = run([str(served.venv / "bin" / "token-service"), "--version"], env=clean_env())
    assert version.stdout.strip() == f"token-service {token_service.__version__}", version
    lines = [json.loads(line) for line in served.log.read_text().splitlines() if line.startswith("{")]
    booted = [line["message"] for line in lines if line.get("logger") == "gunicorn.error"]
    assert any("gevent" in str(message) for message in booted), booted


@pytest.fixture(scope="module")
def client_venv(built: Built, scratch: Path) -> Path:
    """docs/install.md's backend: a fresh venv, the wheel with its client extra from the index."""
    venv = scratch / "client-venv"
    made = run([sys.executable, "-m", "venv", str(venv)], env=clean_env())
    assert made.returncode == 0, made.stderr
    [line] = [line for line in block(1).splitlines() if line.strip()]
    assert line == f"pip install --find-links {CHECKOUT}/dist '{DISTRIBUTION}[client]'"
    command = line.replace(f"{CHECKOUT}/dist", str(built.wheel.parent))
    # the backend's own pip: its venv's bin first on PATH
    env = clean_env()
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    done = run(["bash", "-e", "-c", command], env=env, cwd=scratch)
    from_the_index(done, "the client extra's install")
    return venv


def test_the_client_extra_alone_runs_the_readme_sdk_snippet(
    client_venv: Path, scratch: Path, served: Served
) -> None:
    installed = distributions(client_venv)
    assert {DISTRIBUTION, "redis", "hiredis", "httpx"} | TESTING_KIT <= installed
    assert installed & SERVER_ONLY == set()
    snippet = code_blocks("README.md", "python")[0]
    assert snippet.code in section("README.md", "sdk")
    ran = run(
        [str(client_venv / "bin" / "python"), "-c", pointed_at(snippet.code, served.url)],
        env=clean_env(),
        cwd=scratch,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "Consumed(replayed=False)\n"


# A user's project: its payment code and its tests, nothing of this repository's (no conftest).
USERS_APP = """\
from token_service.client import Replayed, TokenClient


class Checkout:
    def __init__(self, tokens: TokenClient) -> None:
        self.tokens = tokens
        self.charges: list[int] = []

    def pay(self, token: str, amount: int) -> dict:
        try:
            with self.tokens.guard(token, "payment.create", subject="ada") as guard:
                self.charges.append(amount)
                guard.result = {"charged": amount, "charge": len(self.charges)}
            return guard.result
        except Replayed as replay:
            return replay.result
"""
USERS_TESTS = """\
import pytest

from shop.checkout import Checkout
from token_service.client import ServiceUnavailable, TokenInProgress, TokenInvalid


@pytest.fixture
def checkout(token_client):
    return Checkout(token_client)


def test_a_double_click_charges_once(checkout, token_client):
    token = token_client.generate("payment.create", subject="ada").token
    first = checkout.pay(token, 1250)
    again = checkout.pay(token, 1250)
    assert first == again == {"charged": 1250, "charge": 1}
    assert checkout.charges == [1250]


def test_an_expired_token_charges_nothing(checkout, token_client, token_clock):
    token = token_client.generate("payment.create", subject="ada", ttl_seconds=300).token
    token_clock.advance(301)
    with pytest.raises(TokenInvalid):
        checkout.pay(token, 1250)
    assert checkout.charges == []


def test_a_store_outage_charges_nothing_and_the_token_still_works(checkout, token_client, token_faults):
    token = token_client.generate("payment.create", subject="ada").token
    with token_faults.store_down(), pytest.raises(ServiceUnavailable):
        checkout.pay(token, 1250)
    assert checkout.charges == []
    assert checkout.pay(token, 1250)["charge"] == 1


def test_a_payment_in_flight_elsewhere_is_not_charged_again(checkout, token_client, token_faults):
    token = token_client.generate("payment.create", subject="ada").token
    elsewhere = token_faults.in_flight(token, "payment.create", subject="ada")
    with pytest.raises(TokenInProgress):
        checkout.pay(token, 1250)
    elsewhere.crash()
    assert checkout.pay(token, 1250)["charge"] == 1
"""


def test_a_users_project_runs_its_suite_on_the_testing_kit(client_venv: Path, scratch: Path) -> None:
    project = scratch / "users-project"
    (project / "shop").mkdir(parents=True)
    (project / "tests").mkdir()
    (project / "shop" / "__init__.py").write_text("")
    (project / "shop" / "checkout.py").write_text(USERS_APP)
    (project / "tests" / "test_checkout.py").write_text(USERS_TESTS)
    (project / "pytest.ini").write_text("[pytest]\npythonpath = .\nfilterwarnings = error\n")
    added = run([str(client_venv / "bin" / "python"), "-m", "pip", "install", "pytest"], env=clean_env())
    from_the_index(added, "pytest's install")
    # no Redis URL, no conftest: the fixtures come from the installed wheel's entry point alone
    assert not list(project.rglob("conftest.py"))
    env = clean_env()
    ran = run(
        [str(client_venv / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider", "-v"],
        env=env,
        cwd=project,
    )
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]
    # pytest names the plugin by its distribution: the wheel's entry point, not a file of the project
    [plugins] = [line for line in ran.stdout.splitlines() if line.startswith("plugins:")]
    assert f"{DISTRIBUTION}-{token_service.__version__}" in plugins
    assert re.search(r"\b4 passed\b", ran.stdout), ran.stdout[-2000:]


def test_the_sdist_installs_and_serves_the_walkthrough(
    built: Built, scratch: Path, redis_server: RedisServer
) -> None:
    # pip builds the sdist in an isolated environment (hatchling from the index), as a user's does
    target = scratch / "from-sdist"
    done = run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(built.sdist)],
        env=clean_env(),
    )
    from_the_index(done, "installing the sdist")
    for name in RUNTIME_FILES:
        assert (target / name).is_file(), name
    # this run's dependencies, the package from the sdist's install (first on the path)
    port = free_port()
    log = scratch / "sdist-serve.log"
    env = {
        **clean_env(WEB_CONCURRENCY="1", PYTHONPATH=str(target), **DEVELOPMENT),
        "TOKEN_SERVICE_REDIS_URL": redis_server.url,
        "TOKEN_SERVICE_API_KEYS": README_KEY,
    }
    where = run(
        [sys.executable, "-c", "import token_service; print(token_service.__file__)"], env=env, cwd=scratch
    )
    assert where.stdout.startswith(str(target)), where
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "token_service.server.cli", "serve", "--port", str(port)],
            cwd=scratch,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: process.poll() is not None or healthy(url), 120, 0.1, what="serve from the sdist")
        assert process.poll() is None, f"serve exited {process.returncode}: {log.read_text()[-3000:]}"
        walk_through(url)
        assert httpx.get(url + "/openapi.yaml", timeout=10).text == (REPO_ROOT / "openapi.yaml").read_text()
    finally:
        process.terminate()
        process.wait(timeout=60)
    assert process.returncode == 0, log.read_text()[-3000:]
