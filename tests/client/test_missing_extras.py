"""Each part of the SDK that needs more than the base install says what to install.

In a fresh interpreter with the package's import blocked (as where it is not
installed): before, ``TokenClient("http://…")`` raised ``No module named
'httpx'``, ``token_service.client.flask`` ``No module named 'flask'`` and
``token_service.client.fastapi`` ``No module named 'anyio'``, naming neither
the extra nor the distribution (idempotency-token-service).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.processes import REPO_ROOT

# Makes `import <blocked>` fail as it does where the package is not installed.
BLOCKER = """
import sys
blocked = sys.argv[1]
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name == blocked or name.startswith(blocked + "."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Blocked())
try:
    exec(sys.argv[2])
except ModuleNotFoundError as exc:
    print(f"{type(exc).__name__} name={exc.name}: {exc}")
else:
    print("imported")
"""


def run_without(blocked: str, code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", BLOCKER, blocked, code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def extra(name: str) -> str:
    return f"pip install 'idempotency-token-service[{name}]'"


@pytest.mark.parametrize(
    ("blocked", "code", "says"),
    [
        (
            "httpx",
            "from token_service.client import TokenClient\nTokenClient('http://127.0.0.1:8000', api_key='k')",
            f"TokenClient over HTTP needs 'httpx', which is not installed: {extra('client')}",
        ),
        (
            "httpx",
            "from token_service.client import AsyncTokenClient\nAsyncTokenClient('http://127.0.0.1:8000')",
            f"AsyncTokenClient over HTTP needs 'httpx', which is not installed: {extra('client')}",
        ),
        (
            "flask",
            "import token_service.client.flask",
            "token_service.client.flask needs 'flask', which is not installed: pip install 'flask>=3.0'",
        ),
        (
            "flask",  # the decorator by the name the Flask page teaches
            "from token_service.client.flask import require_token",
            "token_service.client.flask needs 'flask', which is not installed: pip install 'flask>=3.0'",
        ),
        (
            "anyio",
            "import token_service.client.fastapi",
            f"token_service.client.fastapi needs 'anyio', which is not installed: {extra('fastapi')}",
        ),
        (
            "fastapi",
            "import token_service.client.fastapi",
            f"token_service.client.fastapi needs 'fastapi', which is not installed: {extra('fastapi')}",
        ),
        (
            "django",
            "import token_service.client.django",
            f"token_service.client.django needs 'django', which is not installed: {extra('django')}",
        ),
        (
            "celery",
            "import token_service.client.celery",
            f"token_service.client.celery needs 'celery', which is not installed: {extra('celery')}",
        ),
        (
            "sqlalchemy",
            "import token_service.client.durable",
            f"token_service.client.durable needs 'sqlalchemy', which is not installed: {extra('db')}",
        ),
    ],
)
def test_a_missing_package_names_the_install_that_brings_it(blocked: str, code: str, says: str) -> None:
    answer = run_without(blocked, code)
    assert answer.startswith(f"ModuleNotFoundError name={blocked}: "), answer  # still what it was
    assert answer.endswith(says), answer


def test_the_sdk_without_extras_still_imports_and_runs_over_redis() -> None:
    # the base install is redis alone: no httpx needed for the direct transport
    code = "from token_service.client import TokenClient\nTokenClient.from_redis('redis://127.0.0.1:1/0').close()"
    assert run_without("httpx", code) == "imported"


def test_a_module_missing_inside_another_package_is_not_blamed_on_an_extra() -> None:
    # Flask is there, but one of its own dependencies is not: the install advice would be wrong
    answer = run_without("markupsafe", "import token_service.client.flask")
    assert answer == "ModuleNotFoundError name=markupsafe: No module named 'markupsafe'", answer
