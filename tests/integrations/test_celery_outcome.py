"""IdempotentTask when its keys' Redis goes away as the result is stored: a real worker on RabbitMQ.

The worker's token client reaches Redis through tests/support/tcp_proxy.py. The
task (``tests.settle_blip``) marks that it ran, the test cuts Redis off, then
lets the task return, so the fault bites exactly while the result is stored:

- for a second: the task succeeds with its result, its body ran once (before,
  ``ServiceUnavailable`` became ``self.retry()`` and the retry ran the body again
  after the lease);
- for longer than the lease: the task fails with ``OutcomeNotRecorded``, is not
  retried, and the worker's log says what reconciling it takes.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integrations.test_celery import BROKER_URL, Worker, published, reachable_tasks
from tests.support.processes import RedisServer, wait_until
from tests.support.tcp_proxy import FaultProxy, Mode
from token_service.client.advanced import operation_token
from token_service.tokens import token_digest

pytestmark = [pytest.mark.real, pytest.mark.slow]
BLIP_SECONDS = 1.0
_NAMES = ("TS_TEST_BROKER_URL", "TS_TEST_REDIS_URL", "TS_TEST_QUEUE", "TS_TEST_PROXIED_REDIS_URL")


@pytest.fixture(scope="module")
def proxy(redis_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(("127.0.0.1", redis_server.port)) as fault_proxy:
        yield fault_proxy


@pytest.fixture(scope="module")
def celery_env(redis_server: RedisServer, proxy: FaultProxy) -> Iterator[dict[str, str]]:
    queue = f"ts-test-{secrets.token_hex(4)}"
    env = {
        **os.environ,
        "TS_TEST_BROKER_URL": BROKER_URL,
        "TS_TEST_REDIS_URL": redis_server.url,
        "TS_TEST_QUEUE": queue,
        "TS_TEST_PROXIED_REDIS_URL": f"redis://127.0.0.1:{proxy.port}/0",
    }
    with published(env, _NAMES, queue):
        yield env


@pytest.fixture(scope="module")
def tasks(celery_env: dict[str, str]) -> Any:
    return reachable_tasks()


@pytest.fixture(scope="module")
def worker(celery_env: dict[str, str], tasks: Any) -> Iterator[Worker]:
    started = Worker(celery_env, "blips").start()
    yield started
    started.stop()


def cut_off(proxy: FaultProxy) -> None:
    """Redis refuses the worker from now on: its pooled connections reset, new ones refused."""
    proxy.set_mode(Mode.REFUSE)
    proxy.reset_all()
    wait_until(lambda: proxy.open_connections == 0, 30, 0.005, "the open connections reset")


def send_and_cut_off(tasks: Any, proxy: FaultProxy, order_id: str) -> Any:
    result = tasks.settle_blip.delay(order_id)
    wait_until(lambda: tasks.counters.get(f"ran:settle_blip:{order_id}:1"), 60, 0.02, "the body to run")
    cut_off(proxy)
    tasks.counters.set(f"go:settle_blip:{order_id}", 1)  # the body returns: its result is stored now
    return result


def test_a_blip_while_the_result_is_stored_runs_the_body_once(
    worker: Worker, tasks: Any, proxy: FaultProxy
) -> None:
    order_id = f"o-{secrets.token_hex(4)}"
    healer = threading.Timer(BLIP_SECONDS, proxy.set_mode, (Mode.PASS,))
    try:
        result = send_and_cut_off(tasks, proxy, order_id)
        healer.start()
        assert result.get(timeout=60) == {"order": order_id, "run": 1}, worker.log()
    finally:
        healer.cancel()
        proxy.set_mode(Mode.PASS)
    assert int(tasks.counters.get(f"runs:settle_blip:{order_id}")) == 1
    # a second message for the order gets the stored result without running
    assert tasks.settle_blip.delay(order_id).get(timeout=60) == {"order": order_id, "run": 1}
    assert int(tasks.counters.get(f"runs:settle_blip:{order_id}")) == 1


def test_an_outage_longer_than_the_lease_fails_the_task_without_a_retry(
    worker: Worker, tasks: Any, proxy: FaultProxy
) -> None:
    order_id = f"o-{secrets.token_hex(4)}"
    try:
        result = send_and_cut_off(tasks, proxy, order_id)
        wait_until(lambda: result.state in ("FAILURE", "SUCCESS"), 60, 0.1, "the task to end")
    finally:
        proxy.set_mode(Mode.PASS)
    assert result.state == "FAILURE", worker.log()
    assert type(result.result).__name__ == "OutcomeNotRecorded"
    assert int(tasks.counters.get(f"runs:settle_blip:{order_id}")) == 1
    log = worker.log()
    assert f"tests.settle_blip[{result.id}]: the body ran but its outcome (complete)" in log
    assert token_digest(operation_token("tests.settle_blip", order_id)) in log  # to reconcile it
    assert f"Task tests.settle_blip[{result.id}] retry" not in log
