"""The code blocks of docs/integrations/{functions,celery,fastapi,django}.md, run as written.

Each page's blocks read the service's Redis from TOKEN_SERVICE_REDIS_URL (set
here to a redis-server the test started). App blocks are written to a module
in a temporary directory and served by the real server (uvicorn) or worker
(celery) they are documented for; the client blocks then run against it, with
the documented localhost:8000 pointed at that server.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.servers import AppServer
from tests.support.docs import code_blocks, run_python
from tests.support.processes import RedisServer, wait_until

pytestmark = [pytest.mark.real, pytest.mark.slow]
FUNCTIONS = "docs/integrations/functions.md"
CELERY = "docs/integrations/celery.md"
FASTAPI = "docs/integrations/fastapi.md"
DJANGO = "docs/integrations/django.md"


@pytest.fixture
def redis_env(redis_server: RedisServer, real_redis: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("TOKEN_SERVICE_REDIS_URL", redis_server.url)
    return {"TOKEN_SERVICE_REDIS_URL": redis_server.url}


@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    repo = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), repo]))
    return tmp_path


def test_functions_page(redis_env: dict[str, str]) -> None:
    blocks = code_blocks(FUNCTIONS, "python")
    assert len(blocks) == 8
    namespace: dict[str, object] = {"__name__": "docs_functions"}
    for block in blocks:
        run_python(block, namespace)


def test_fastapi_page(redis_env: dict[str, str], module_dir: Path) -> None:
    app_block, client_block = code_blocks(FASTAPI, "python")
    (module_dir / "docs_fastapi_app.py").write_text(app_block.code)
    server = AppServer.uvicorn("docs_fastapi_app:app", {**redis_env, "PYTHONPATH": os.environ["PYTHONPATH"]})
    server.health_path = "/openapi.json"
    server.start()
    try:
        run_python(client_block, {}, base_url=server.url)
    finally:
        server.stop()


def test_django_page(redis_env: dict[str, str], module_dir: Path) -> None:
    settings_block, views_block, urls_block, client_block = code_blocks(DJANGO, "python")
    package = module_dir / "docs_django"
    package.mkdir()
    (package / "__init__.py").write_text("")
    base = (
        'SECRET_KEY = "docs-test"\nALLOWED_HOSTS = ["127.0.0.1"]\nROOT_URLCONF = "docs_django.urls"\n'
        'INSTALLED_APPS = ["rest_framework"]\nDATABASES = {}\n'
        'REST_FRAMEWORK = {"DEFAULT_AUTHENTICATION_CLASSES": [], "DEFAULT_PERMISSION_CLASSES": [],'
        ' "UNAUTHENTICATED_USER": None}\n'
    )
    (package / "settings.py").write_text(base + settings_block.code)
    (package / "views.py").write_text(views_block.code)
    # the page's urls, plus a health check for the test to wait on
    health = (
        "\nfrom django.http import HttpResponse\n"
        "urlpatterns.append(path('healthz', lambda request: HttpResponse('ok')))\n"
    )
    (package / "urls.py").write_text("from docs_django.views import *  # noqa\n" + urls_block.code + health)
    (package / "asgi.py").write_text(
        "import os\nos.environ.setdefault('DJANGO_SETTINGS_MODULE', 'docs_django.settings')\n"
        "from django.core.asgi import get_asgi_application\napplication = get_asgi_application()\n"
    )
    env = {**redis_env, "PYTHONPATH": os.environ["PYTHONPATH"]}
    server = AppServer.uvicorn("docs_django.asgi:application", env).start()
    try:
        run_python(client_block, {}, base_url=server.url)
        # the async view, under Django's ASGI handler
        import httpx

        ada = {"X-User-Id": "ada"}
        token = httpx.post(
            server.url + "/checkout/token", json={"amount": 7}, headers=ada, timeout=30
        ).json()["token"]
        headers = {**ada, "Idempotency-Token": token}
        paid = [
            httpx.post(server.url + "/payments-async", json={"amount": 7}, headers=headers, timeout=30)
            for _ in range(2)
        ]
        assert paid[0].json() == paid[1].json()
        assert paid[1].headers["Idempotent-Replayed"] == "true"
    finally:
        server.stop()


@pytest.fixture
def celery_queue() -> Iterator[str]:
    queue = f"ts-docs-{secrets.token_hex(4)}"
    yield queue
    from kombu import Connection

    with Connection("amqp://guest:guest@127.0.0.1:5672//") as connection:
        connection.default_channel.queue_delete(queue)


def test_celery_page(
    redis_env: dict[str, str], module_dir: Path, celery_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app_block, send_block = code_blocks(CELERY, "python")
    (module_dir / "shop.py").write_text(app_block.code)
    monkeypatch.setenv("CELERY_QUEUE", celery_queue)
    env = {**os.environ}
    log_path = module_dir / "worker.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "shop", "worker", "--pool=solo", "--loglevel=INFO",
             "--without-mingle", "--without-gossip", "-Q", celery_queue],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=module_dir,
        )  # fmt: skip
    try:
        wait_until(lambda: " ready." in log_path.read_text(errors="replace"), 60, what="the docs' worker")
        import shop  # the page's app, as the worker runs it

        namespace: dict[str, object] = dict(vars(shop))
        run_python(send_block, namespace)
        wait_until(
            lambda: "already ran for this key" in log_path.read_text(errors="replace"), 30, what="a replay"
        )
    finally:
        worker.kill()
        worker.wait(timeout=10)
        sys.modules.pop("shop", None)
