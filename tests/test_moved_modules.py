"""Modules that moved in 0.2.0 still import at their old paths, warning, until 0.3.0.

``token_service.admin`` and ``token_service.reconcile`` went to ``token_service.ops``;
``token_service.gunicorn_conf`` (``gunicorn -c python:token_service.gunicorn_conf``) to
``token_service.server``; ``token_service.client.idempotency`` (the WSGI middleware) is
``token_service.client.wsgi``, ``token_service.client.functions`` (``@idempotent``,
``keyed_guard``) ``token_service.client.keyed``. Importing an old path raises a
``DeprecationWarning`` naming the new one and hands back the new module itself; CHANGELOG.md
names the version they go in.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from tests.support.processes import REPO_ROOT
from token_service import __version__

MOVED = {
    "token_service.admin": "token_service.ops.admin",
    "token_service.reconcile": "token_service.ops.reconcile",
    "token_service.gunicorn_conf": "token_service.server.gunicorn_conf",
    "token_service.client.idempotency": "token_service.client.wsgi",
    "token_service.client.functions": "token_service.client.keyed",
}
GOES_IN = "0.3.0"


@pytest.fixture
def unimported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The old paths not yet imported in this process (the first import is the one that warns)."""
    for old in MOVED:
        parent, name = old.rsplit(".", 1)
        monkeypatch.delitem(sys.modules, old, raising=False)
        monkeypatch.delattr(importlib.import_module(parent), name, raising=False)


@pytest.mark.parametrize("old", sorted(MOVED))
@pytest.mark.usefixtures("unimported")
def test_the_old_path_warns_naming_the_new_one_and_is_the_new_module(old: str) -> None:
    new = MOVED[old]
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new}; the old path goes in {GOES_IN}"):
        aliased = importlib.import_module(old)
    assert aliased is importlib.import_module(new)


@pytest.mark.usefixtures("unimported")
def test_from_imports_of_the_old_paths_get_the_same_objects() -> None:
    from token_service.ops import admin, reconcile

    with pytest.warns(DeprecationWarning, match="token_service.admin moved to token_service.ops.admin"):
        from token_service.admin import check_ref
    with pytest.warns(DeprecationWarning, match="token_service.reconcile moved"):
        from token_service import reconcile as old_reconcile
    assert check_ref is admin.check_ref
    assert old_reconcile is reconcile


@pytest.mark.usefixtures("unimported")
def test_the_wsgi_middleware_imports_from_its_old_path_as_the_same_class() -> None:
    from token_service.client import wsgi

    with pytest.warns(DeprecationWarning, match="client.idempotency moved to token_service.client.wsgi"):
        from token_service.client.idempotency import IdempotencyMiddleware, default_store_status
    assert IdempotencyMiddleware is wsgi.IdempotencyMiddleware
    assert default_store_status is wsgi.default_store_status


@pytest.mark.usefixtures("unimported")
def test_the_keyed_functions_import_from_their_old_path_as_the_same_objects() -> None:
    from token_service.client import keyed

    with pytest.warns(DeprecationWarning, match="client.functions moved to token_service.client.keyed"):
        from token_service.client.functions import DEFAULT_KEY_TTL_SECONDS, idempotent, keyed_guard
    assert idempotent is keyed.idempotent
    assert keyed_guard is keyed.keyed_guard
    assert DEFAULT_KEY_TTL_SECONDS == keyed.DEFAULT_KEY_TTL_SECONDS


def test_the_warning_points_at_the_importing_line() -> None:
    # stacklevel: a user's `python -W error` names their own import, not importlib's internals
    done = subprocess.run(
        [
            sys.executable,
            "-W",
            "error::DeprecationWarning",
            "-c",
            "import os\nimport token_service.reconcile",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert 'File "<string>", line 2' in done.stderr
    assert "DeprecationWarning: token_service.reconcile moved to token_service.ops.reconcile" in done.stderr


def test_gunicorn_reads_the_settings_through_the_old_config_path() -> None:
    # what `gunicorn -c python:token_service.gunicorn_conf` does with the module
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from gunicorn.config import Config\n"
            "from gunicorn.app.base import Application\n"
            "class App(Application):\n"
            "    def init(self, *args): pass\n"
            "    def load(self): pass\n"
            "app = App.__new__(App)\n"
            "app.cfg = Config()\n"
            "app.load_config_from_module_name_or_filename('python:token_service.gunicorn_conf')\n"
            "print(app.cfg.worker_class_str)\n",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "gevent"


def test_the_changelog_says_when_the_aliases_go() -> None:
    changelog = (REPO_ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    released = changelog.split(f"## [{__version__}]", 1)[1].split("\n## [", 1)[0]
    deprecated = released.split("### Deprecated", 1)[1].split("\n### ", 1)[0]
    for old in MOVED:
        assert f"`{old}`" in deprecated
    assert f"removed in {GOES_IN}" in " ".join(deprecated.split())
