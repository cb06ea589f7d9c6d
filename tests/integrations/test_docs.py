"""The code blocks of docs/integrations/{functions,celery,fastapi,django}.md, run as written.

Each page's blocks read the service's Redis from TOKEN_SERVICE_REDIS_URL (set
here to a redis-server the test started). App blocks are written to a module
in a temporary directory and served by the real server (uvicorn) or worker
(celery) they are documented for; the client blocks then run against it, with
the documented address pointed at that server. The FastAPI and Django pages show
their example's files, written out on the page (a reader of the raw Markdown sees
the code, not an include line): the test holds each copy to its file and serves
the example itself, with two workers as deployed.
"""

from __future__ import annotations

import concurrent.futures
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
from tests.support.processes import REPO_ROOT, RedisServer, wait_until

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


def pay_many_at_once(url: str, payment: dict[str, object], count: int = 12) -> list[str]:
    """``count`` checkouts paid concurrently, each on a new connection (any worker): the receipts' ids."""
    import httpx

    def checkout(n: int) -> str:
        ada = {"X-User-Id": f"user-{n}", "Connection": "close"}
        token = httpx.post(url + "/checkout/token", json=payment, headers=ada, timeout=30).json()["token"]
        paid = httpx.post(
            url + "/payments", json=payment, headers={**ada, "Idempotency-Token": token}, timeout=30
        )
        assert paid.status_code == 201, paid.text
        return str(paid.json()["id"])

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(checkout, range(count)))


def test_fastapi_page(redis_env: dict[str, str]) -> None:
    app_block, client_block = code_blocks(FASTAPI, "python")
    assert app_block.code == (REPO_ROOT / "examples/fastapi_app/app.py").read_text(), (
        "docs/integrations/fastapi.md and examples/fastapi_app/app.py differ: change both"
    )
    # as deployed: more than one worker process
    server = AppServer.uvicorn("examples.fastapi_app.app:app", redis_env, "--workers", "2").start()
    try:
        run_python(client_block, {}, base_url=server.url)
        ids = pay_many_at_once(server.url, {"amount": 700, "currency": "EUR"})
        assert len(set(ids)) == len(ids), ids  # one numbering for both workers
        import httpx

        charges = httpx.get(server.url + "/payments", timeout=30).json()["charges"]
        assert len(charges) == len(ids) + 1  # and one bank: the page's payment and these
    finally:
        server.stop()


def test_django_page(redis_env: dict[str, str]) -> None:
    settings_block, views_block, urls_block, client_block = code_blocks(DJANGO, "python")
    for block, example in [(settings_block, "settings"), (views_block, "views"), (urls_block, "urls")]:
        assert block.code == (REPO_ROOT / f"examples/django_app/{example}.py").read_text(), (
            f"docs/integrations/django.md and examples/django_app/{example}.py differ: change both"
        )
    server = AppServer.gunicorn("examples.django_app.wsgi", redis_env, "--workers", "2")
    server.health_path = "/payments/list"
    server.start()
    try:
        run_python(client_block, {}, base_url=server.url)
        ids = pay_many_at_once(server.url, {"amount": 7})
        assert len(set(ids)) == len(ids), ids  # one numbering for both workers
        import httpx

        charges = httpx.get(server.url + "/payments/list", timeout=30).json()["charges"]
        assert len(charges) == len(ids) + 1
        # the async view
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
        mismatch = httpx.post(server.url + "/payments-async", json={"amount": 1}, headers=headers, timeout=30)
        assert mismatch.json()["code"] == "token_mismatch"
    finally:
        server.stop()


@pytest.fixture
def celery_queue() -> Iterator[str]:
    queue = f"ts-docs-{secrets.token_hex(4)}"
    yield queue
    from kombu import Connection

    with Connection("amqp://guest:guest@127.0.0.1:5672//") as connection:
        connection.default_channel.queue_delete(queue)


def _ready(worker: subprocess.Popen[bytes], log_path: Path) -> bool:
    if worker.poll() is not None:
        raise AssertionError(
            f"the worker exited ({worker.returncode}):\n{log_path.read_text(errors='replace')}"
        )
    return " ready." in log_path.read_text(errors="replace")


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
        # 120 s: a worker's start (celery, kombu, the page's app, RabbitMQ) once took more than 60 s
        # at load 15 on 2 cores; the wait ends when the worker says it is ready
        try:
            wait_until(lambda: _ready(worker, log_path), 120, what="the docs' worker")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; its log:\n{log_path.read_text(errors='replace')[-3000:]}") from exc
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
