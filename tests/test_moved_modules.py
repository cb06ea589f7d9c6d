"""The paths modules had before they moved are gone: they never reached a release.

``token_service.admin`` and ``token_service.reconcile`` are ``token_service.ops``'s;
``token_service.gunicorn_conf`` (``gunicorn -c python:token_service.gunicorn_conf``) is
``token_service.server.gunicorn_conf``; ``token_service.client.idempotency`` (the WSGI
middleware) is ``token_service.client.wsgi``, ``token_service.client.functions``
(``@idempotent``, ``keyed_guard``) ``token_service.client.keyed``. They were aliases that
warned during 0.2.0's development; importing one now fails, and CHANGELOG.md says so
under "Removed", naming the new path.
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


@pytest.mark.parametrize("old", sorted(MOVED))
def test_the_old_path_no_longer_imports(old: str) -> None:
    sys.modules.pop(old, None)
    with pytest.raises(ModuleNotFoundError, match=rf"No module named '{old}'"):
        importlib.import_module(old)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_the_new_path_imports(old: str) -> None:
    assert importlib.import_module(MOVED[old]).__name__ == MOVED[old]


def test_no_file_is_left_at_an_old_path() -> None:
    package = REPO_ROOT / "token_service"
    left = [old for old in MOVED if (REPO_ROOT / (old.replace(".", "/") + ".py")).exists()]
    assert left == []
    assert not (package / "_moved.py").exists()


def test_gunicorn_refuses_the_old_config_path_and_reads_the_new_one() -> None:
    # what `gunicorn -c python:<module>` does with the module
    script = (
        "import sys\n"
        "from gunicorn.config import Config\n"
        "from gunicorn.app.base import Application\n"
        "class App(Application):\n"
        "    def init(self, *args): pass\n"
        "    def load(self): pass\n"
        "app = App.__new__(App)\n"
        "app.cfg = Config()\n"
        "app.load_config_from_module_name_or_filename('python:' + sys.argv[1])\n"
        "print(app.cfg.worker_class_str)\n"
    )
    runs = {
        module: subprocess.run(
            [sys.executable, "-c", script, module],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        for module in ("token_service.gunicorn_conf", "token_service.server.gunicorn_conf")
    }
    old, new = runs["token_service.gunicorn_conf"], runs["token_service.server.gunicorn_conf"]
    assert old.returncode != 0
    assert "No module named 'token_service.gunicorn_conf'" in old.stderr
    assert new.returncode == 0, new.stderr
    assert new.stdout.strip() == "gevent"


def test_the_changelog_says_they_are_removed_and_names_the_new_paths() -> None:
    changelog = (REPO_ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    unreleased = changelog.split(f"## [{__version__}]", 1)[1].split("\n## [", 1)[0]
    assert "### Deprecated" not in unreleased
    removed = " ".join(unreleased.split("### Removed", 1)[1].split("\n### ", 1)[0].split())
    for old, new in MOVED.items():
        assert f"`{old}`" in removed
        assert f"`{new}`" in removed
    assert "before the first release" in removed
