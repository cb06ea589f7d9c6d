"""The oldest releases pyproject.toml allows for the service's and the SDK's dependencies
still pass the tests that use them.

For each case below, every ``name[extras]>=X`` of its extras is installed at exactly X (from
the package index, into a temporary folder, with what each of them requires, as a user's
install would resolve it; redis-py held at the venv's release) and put in front of the venv;
then a focused set of tests runs on them in a subprocess:

- ``server``, ``client``, ``telemetry``: the HTTP API (Flask, marshmallow) on the embedded store
  (fakeredis with Lua), CORS (flask-cors), metrics and JSON logs (prometheus-client,
  python-json-logger), the SDK's HTTP transport (httpx) and its telemetry (OpenTelemetry), the
  testing kit's fixtures on the client extra's fakeredis;
- ``db``: the durable backstop (SQLAlchemy) on SQLite, PostgreSQL (psycopg) and MariaDB (PyMySQL);
- ``asgi`` and ``fastapi`` (one install: their uvicorn floor is the same): the ASGI middleware
  under uvicorn and FastAPI's ``require_token``;
- ``celery``: tasks once per key in real workers on RabbitMQ;
- ``django``: ``@require_token`` and the middleware under gunicorn and uvicorn.
- ``granian``: the service under ``token-service serve --server granian`` (metrics across
  workers, JSON logs, drain).

The floors of redis-py and of gunicorn and gevent have their own tests
(tests/test_redis_py_minimum.py, tests/edge/test_gunicorn_floor.py). The ``bench`` and ``dev``
extras are developer tooling, installed only from requirements/dev.lock, never resolved by a
user: their floors are not run here (pyproject.toml says what they are).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.support.processes import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.real]

HAS_OWN_TEST = {"gunicorn", "gevent"}


@dataclass(frozen=True)
class Case:
    extras: tuple[str, ...]
    # pytest node ids; a test named without its [parameters] runs with all of them
    tests: tuple[str, ...]


CASES = {
    "server-client-telemetry": Case(
        ("server", "client", "telemetry"),
        (
            "tests/test_api.py",
            "tests/edge/test_cors.py",
            "tests/edge/test_telemetry.py",
            "tests/client/test_client.py",
            "tests/client/test_sdk_telemetry.py",
            # the testing kit (the client extra's fakeredis[lua]): its clock reaches into fakeredis
            "tests/testing/test_kit_fixtures.py",
        ),
    ),
    "db": Case(("db",), ("tests/durable",)),
    "asgi-fastapi": Case(
        ("asgi", "fastapi"),
        (
            # both apps (Starlette's and FastAPI's) under uvicorn: replay, a body cut short, the
            # error table, streamed and file responses, a client that leaves mid-stream
            "tests/client/test_asgi_uvicorn.py::test_first_request_runs_and_a_repeat_is_replayed",
            "tests/client/test_asgi_uvicorn.py::test_a_body_cut_short_runs_nothing_and_leaves_the_key_free",
            "tests/client/test_asgi_uvicorn.py::test_the_error_table",
            "tests/client/test_asgi_uvicorn.py::test_a_large_stream_passes_through_and_is_stored_omitted",
            "tests/client/test_asgi_uvicorn.py::test_a_file_response_is_replayed",
            "tests/client/test_asgi_uvicorn.py::test_a_client_that_leaves_mid_stream_leaves_the_work_recorded",
            "tests/integrations/test_fastapi.py::test_a_duplicate_gets_the_first_response_and_the_endpoint_runs_once",
            "tests/integrations/test_fastapi.py::test_concurrent_duplicates_without_waiting_get_409_in_progress",
            "tests/integrations/test_fastapi.py::test_sync_endpoints_and_returned_responses",
            "tests/integrations/test_fastapi.py::test_a_stored_4xx_is_replayed_a_5xx_or_an_exception_frees_the_token",
            "tests/integrations/test_fastapi.py::test_a_streamed_response_is_recorded_as_it_goes_out_and_replayed",
            "tests/integrations/test_fastapi.py::test_the_error_table",
        ),
    ),
    "celery": Case(
        ("celery",),
        (
            # a redelivery, a retry while the key is held
            "tests/integrations/test_celery.py::test_the_same_task_id_sent_twice_runs_once",
            "tests/integrations/test_celery.py::test_a_duplicate_retries_while_the_key_is_held_then_gets_the_holders_result",
        ),
    ),
    "granian": Case(
        ("granian",),
        (
            "tests/edge/test_gunicorn.py::test_metrics_count_every_request_once_across_workers[granian]",
            "tests/edge/test_gunicorn.py::test_log_lines_are_json_with_request_ids_and_no_tokens[granian]",
            "tests/edge/test_gunicorn.py::test_readiness_fails_while_draining_then_the_server_stops[granian]",
        ),
    ),
    "django": Case(
        ("django",),
        (
            # under gunicorn (WSGI) and uvicorn (Django's ASGI handler), sync, async and DRF views
            "tests/integrations/test_django.py::test_a_duplicate_gets_the_first_response",
            "tests/integrations/test_django.py::test_drf_view",
            "tests/integrations/test_django.py::test_the_error_table",
            "tests/integrations/test_django.py::test_middleware_runs_a_key_once_and_replays_it",
            "tests/integrations/test_django.py::test_middleware_error_table",
            "tests/integrations/test_django.py::test_middleware_a_body_cut_short_runs_nothing",
        ),
    ),
}


def floors(extras: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """name → (what to install, X) for every ``name[extras]>=X`` of those extras."""
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    found: dict[str, tuple[str, str]] = {}
    for extra in extras:
        for requirement in pyproject["project"]["optional-dependencies"][extra]:
            match = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?>=([\w.]+)", requirement)
            assert match, f"{extra}: {requirement!r} is not name>=floor"
            name, features, version = match.groups()
            if name not in HAS_OWN_TEST:
                found[name] = (f"{name}{features or ''}=={version}", version)
    return found


def test_every_floor_is_pinned_as_name_at_least_version() -> None:
    every = floors(tuple(extra for case in CASES.values() for extra in case.extras))
    assert {"flask", "httpx", "sqlalchemy", "psycopg", "pymysql", "uvicorn", "fastapi"} <= every.keys()
    assert {"celery", "django"} <= every.keys()


def test_every_user_facing_extra_has_a_case() -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    tooling = {"bench", "dev"}  # installed from requirements/dev.lock only (the module's docstring)
    covered = {extra for case in CASES.values() for extra in case.extras}
    assert covered == pyproject["project"]["optional-dependencies"].keys() - tooling


# Each case is an xdist group of its own (tests/conftest.py): its install and its tests share
# nothing with another case's (a folder of tmp_path, servers on free ports), so under make test
# the five run on several workers at once instead of one after another.
@pytest.mark.parametrize(
    "case", [pytest.param(case, marks=pytest.mark.xdist_group(f"floors[{case}]")) for case in sorted(CASES)]
)
def test_the_tests_pass_on_the_floor_releases(case: str, tmp_path: Path) -> None:
    wanted = floors(CASES[case].extras)
    target = tmp_path / "floors"
    installs = [*sorted(install for install, _ in wanted.values()), f"redis=={redis.__version__}"]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), *installs],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        message = f"could not install the floors of {case}: {done.stderr[-800:]}"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(REPO_ROOT)])}
    check = (
        "import sys\n"
        "from importlib.metadata import version\n"
        "from packaging.version import Version\n"
        "for name, floor in (arg.split('=') for arg in sys.argv[1:]):\n"
        "    assert Version(version(name)) == Version(floor), (name, version(name), floor)\n"
    )
    versions = [f"{name}={version}" for name, (_, version) in wanted.items()]
    imported = subprocess.run(
        [sys.executable, "-c", check, *versions], env=env, capture_output=True, text=True, timeout=60
    )
    assert imported.returncode == 0, imported.stderr
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *CASES[case].tests],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert run.returncode == 0, f"on the floors {versions}:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"
