"""Celery tasks run once per key: real worker processes, RabbitMQ as the broker, a real redis-server.

RabbitMQ runs on 127.0.0.1:5672 (guest/guest) on these machines and CI's; each
test session uses a queue of its own and deletes it at the end.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import REPO_ROOT, RedisServer, children, wait_until
from tests.support.skew import faketime_command, faketime_env
from token_service.client.advanced import operation_token
from token_service.store import TokenStore

pytestmark = [pytest.mark.real, pytest.mark.slow]
BROKER_URL = os.environ.get("TS_TEST_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")


def _celery_tasks() -> Any:
    """tests.integrations.celery_tasks as this environment configures it. Not ``from
    tests.integrations import celery_tasks``: that takes the package's attribute, the module an
    earlier test module imported with its own queue and Redis, though sys.modules no longer has it."""
    return importlib.import_module("tests.integrations.celery_tasks")


@contextlib.contextmanager
def published(env: dict[str, str], names: Sequence[str], queue: str) -> Iterator[None]:
    """The test process publishes with the workers' app: ``names`` of ``env`` set in its own
    environment (tests.integrations.celery_tasks reads them on import), put back afterwards,
    and the test's queue deleted."""
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({name: env[name] for name in saved})
    sys.modules.pop("tests.integrations.celery_tasks", None)
    yield
    celery_tasks = _celery_tasks()
    with celery_tasks.app.connection_for_write() as connection:
        connection.default_channel.queue_delete(queue)
    sys.modules.pop("tests.integrations.celery_tasks", None)
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def reachable_tasks() -> Any:
    """tests.integrations.celery_tasks, once its broker answers (a test fails, naming it, if not)."""
    celery_tasks = _celery_tasks()
    with celery_tasks.app.connection_for_write() as connection:
        try:
            connection.ensure_connection(max_retries=1)
        except Exception as exc:
            pytest.fail(f"RabbitMQ is not reachable at {BROKER_URL}: {exc}", pytrace=False)
    return celery_tasks


class Worker:
    """``celery worker`` for tests/integrations/celery_tasks.py, in its own process."""

    def __init__(
        self,
        env: dict[str, str],
        name: str,
        pool: str = "solo",
        concurrency: int = 1,
        prefix: Sequence[str] = (),
    ) -> None:
        self.env = env
        self.prefix = list(prefix)  # e.g. faketime's, to run the worker with its clock shifted
        self.name = f"{name}-{secrets.token_hex(3)}@localhost"
        self.args = [f"--pool={pool}", f"--concurrency={concurrency}"]
        self.log_path = Path(tempfile.mkstemp(prefix="ts-celery-", suffix=".log")[1])
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Worker:
        command = [
            *self.prefix, sys.executable, "-m", "celery", "-A", "tests.integrations.celery_tasks", "worker",
            "-n", self.name, "-Q", self.env["TS_TEST_QUEUE"], "--loglevel=INFO",
            "--without-mingle", "--without-gossip", "--without-heartbeat", *self.args,
        ]  # fmt: skip
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                # a prefix (faketime) runs the worker as its child: signals go to the whole group
                start_new_session=bool(self.prefix),
            )

        def ready() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"the worker exited:\n{self.log()}")
            return " ready." in self.log()

        wait_until(ready, timeout_seconds=60, what=f"celery worker {self.name}")
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _signal(self, sig: int) -> None:
        assert self.process is not None
        if not self.prefix:
            self.process.send_signal(sig)
            return
        with contextlib.suppress(ProcessLookupError):  # the group may just have ended
            os.killpg(self.process.pid, sig)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)
        assert self.process is not None
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            # cold shutdown (a warm one waits ~10 s on the broker); whatever is unacked is redelivered
            self._signal(signal.SIGQUIT)
            try:
                self.process.wait(timeout=3)
                if self.prefix:  # the worker outlives faketime, its parent, by its cold shutdown
                    wait_until(self._group_gone, timeout_seconds=3, what="the worker's process group")
            except (subprocess.TimeoutExpired, TimeoutError):
                self._signal(signal.SIGKILL)
                self.process.wait()
        self.log_path.unlink(missing_ok=True)

    def _group_gone(self) -> bool:
        assert self.process is not None
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            return True
        return False

    def finished(self, task: str, task_id: str) -> int:
        """How many deliveries of that task id this worker finished (succeeded or not)."""
        log, prefix = self.log(), f"Task {task}[{task_id}] "
        return log.count(prefix) - log.count(prefix + "received")


@pytest.fixture(scope="module")
def celery_env(redis_server: RedisServer) -> Iterator[dict[str, str]]:
    queue = f"ts-test-{secrets.token_hex(4)}"
    env = {
        **os.environ,
        "TS_TEST_BROKER_URL": BROKER_URL,
        "TS_TEST_REDIS_URL": redis_server.url,
        "TS_TEST_QUEUE": queue,
    }
    with published(env, ("TS_TEST_BROKER_URL", "TS_TEST_REDIS_URL", "TS_TEST_QUEUE"), queue):
        yield env


@pytest.fixture(scope="module")
def tasks(celery_env: dict[str, str]) -> Any:
    return reachable_tasks()


@pytest.fixture
def worker(celery_env: dict[str, str], tasks: Any) -> Iterator[Worker]:
    started = Worker(celery_env, "solo").start()
    yield started
    started.stop()


def test_the_same_task_id_sent_twice_runs_once(worker: Worker, tasks: Any) -> None:
    task_id = secrets.token_hex(8)
    # the same message three times: what a redelivery looks like to the worker
    sent = [tasks.record.apply_async(("a",), task_id=task_id) for _ in range(3)]
    wait_until(lambda: worker.finished("tests.record", task_id) == 3, timeout_seconds=60, what="3 deliveries")
    assert [result.get(timeout=60) for result in sent] == [{"label": "a", "run": 1}] * 3
    assert int(tasks.counters.get("runs:record:a")) == 1
    assert worker.log().count("already ran for this key; its stored result is returned") == 2
    # another message is another task: it runs
    assert tasks.record.apply_async(("a",)).get(timeout=60) == {"label": "a", "run": 2}


def test_concurrent_duplicates_by_key_run_once_and_all_get_its_result(
    celery_env: dict[str, str], tasks: Any
) -> None:
    workers = [Worker(celery_env, f"threads{i}", pool="threads", concurrency=4).start() for i in range(2)]
    try:
        sent = [tasks.charge.delay("o-1", 10) for _ in range(8)]  # eight messages, eight task ids
        results = [result.get(timeout=120) for result in sent]
    finally:
        for started in workers:
            started.stop()
    assert results == [{"order": "o-1", "amount": 10, "run": 1}] * 8
    assert int(tasks.counters.get("runs:charge:o-1")) == 1


def test_a_worker_killed_mid_task_is_taken_over_after_the_lease(
    celery_env: dict[str, str], tasks: Any
) -> None:
    first = Worker(celery_env, "doomed").start()
    task_id = secrets.token_hex(8)
    result = tasks.slow.apply_async(("job-1",), task_id=task_id)
    try:
        wait_until(
            lambda: tasks.counters.get("starts:slow:job-1") == b"1", timeout_seconds=60, what="the start"
        )
        first.kill()  # SIGKILL mid-task: no ack, no fail(), no lease renewal any more
        lease = dead_lease(tasks, task_id)
        second = Worker(celery_env, "heir").start()
    finally:
        first.stop()
    try:
        # RabbitMQ redelivers the unacked message; the heir finds the dead lease live, retries
        # when it runs out, then takes the key over and finishes the job
        assert result.get(timeout=120) == {"job": "job-1", "start": 2}
        again = tasks.slow.apply_async(("job-1",), task_id=task_id)
        assert again.get(timeout=60) == {"job": "job-1", "start": 2}
        assert int(tasks.counters.get("starts:slow:job-1")) == 2
        assert int(tasks.counters.get("at:slow:job-1:2")) >= lease  # not before the dead lease ran out
    finally:
        second.stop()


def test_a_prefork_child_killed_mid_task_is_taken_over_after_the_lease(
    celery_env: dict[str, str], tasks: Any
) -> None:
    # the pool's child dies (OOM killer, SIGKILL), not the worker: task_reject_on_worker_lost requeues
    # the message; the redelivery runs the body again only once the dead child's lease has run out
    worker = Worker(celery_env, "prefork", pool="prefork", concurrency=1).start()
    try:
        result = tasks.slow.apply_async(("job-prefork",))
        wait_until(
            lambda: tasks.counters.get("starts:slow:job-prefork") == b"1",
            timeout_seconds=60,
            what="the start",
        )
        assert worker.process is not None
        [child] = children(worker.process.pid)
        os.kill(child, signal.SIGKILL)
        wait_until(lambda: dead(child), 30, what="the child to die")
        lease = dead_lease(tasks, result.id)
        assert result.get(timeout=120) == {"job": "job-prefork", "start": 2}
        assert int(tasks.counters.get("starts:slow:job-prefork")) == 2
        assert int(tasks.counters.get("at:slow:job-prefork:2")) >= lease
    finally:
        worker.stop()


def dead_lease(tasks: Any, task_id: str) -> int:
    """When the lease of a holder just killed runs out (Redis clock, ms); it is renewed no more.

    Read at once after the kill. Should this process have been too slow for that (the lease
    is 2 s, renewed every 0.67 s until the kill), it has run out already and when is not
    known: 0, and the test shows only that the redelivery ran the body once more."""
    record = TokenStore(tasks.counters).inspect(operation_token("tests.slow", task_id))
    return record.lease_expires_ms or 0


def dead(pid: int) -> bool:
    """The process is gone or a zombie (killed; its parent has not reaped it yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_a_terminal_failure_is_recorded_and_duplicates_get_it(worker: Worker, tasks: Any) -> None:
    first = tasks.refund.delay("o-9")
    with pytest.raises(tasks.Declined):
        first.get(timeout=60)
    second = tasks.refund.delay("o-9")
    with pytest.raises(Exception, match="failed for good") as failed:
        second.get(timeout=60)
    assert type(failed.value).__name__ == "TokenFailed"
    assert int(tasks.counters.get("runs:refund:o-9")) == 1


def test_a_duplicate_retries_while_the_key_is_held_then_gets_the_holders_result(
    worker: Worker, tasks: Any
) -> None:
    from token_service.client import keyed_guard

    holder = keyed_guard(tasks.tokens, "tests.charge", "o-held", lease_seconds=60)
    assert holder.start()
    result = tasks.charge.delay("o-held", 5)
    wait_until(lambda: "key in progress elsewhere" in worker.log(), timeout_seconds=60, what="a retry")
    assert not result.ready()
    holder.succeed({"order": "o-held", "amount": 5, "run": "by the holder"})
    assert result.get(timeout=60) == {"order": "o-held", "amount": 5, "run": "by the holder"}
    assert tasks.counters.get("runs:charge:o-held") is None


@pytest.mark.parametrize("shift_seconds", [-10, +10])
def test_a_worker_whose_clock_is_off_comes_back_after_its_countdown_and_runs_nothing_twice(
    celery_env: dict[str, str], tasks: Any, shift_seconds: int
) -> None:
    """The retry countdown of a held key is a duration (the store's Retry-After): a worker whose
    wall clock is 10 s off (faketime, its monotonic clock true) is refused, comes back after the
    countdown, is refused again, then gets the holder's result; the body never runs."""
    from token_service.client import keyed_guard

    before = datetime.now()
    worker = Worker(faketime_env(celery_env), "skewed", prefix=faketime_command(shift_seconds)).start()
    try:
        # the worker's log is stamped by its own clock: shifted, whatever the machine's pace
        first = re.search(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+", worker.log(), re.MULTILINE)
        assert first is not None, worker.log()
        stamped = datetime.strptime(first.group(1), "%Y-%m-%d %H:%M:%S")
        shift = timedelta(seconds=shift_seconds)
        assert before + shift - timedelta(seconds=1) <= stamped <= datetime.now() + shift

        key = f"o-skew-{secrets.token_hex(4)}"
        holder = keyed_guard(tasks.tokens, "tests.charge", key, lease_seconds=60)
        assert holder.start()
        result = tasks.charge.delay(key, 5)
        wait_until(
            lambda: worker.log().count("key in progress elsewhere") >= 2,
            timeout_seconds=60,
            what="a retry that came back after its countdown",
        )
        assert not result.ready()
        holder.succeed({"order": key, "amount": 5, "run": "by the holder"})
        assert result.get(timeout=60) == {"order": key, "amount": 5, "run": "by the holder"}
        assert tasks.counters.get(f"runs:charge:{key}") is None
    finally:
        worker.stop()


def test_the_example_runs_with_one_command(celery_env: dict[str, str], redis_server: RedisServer) -> None:
    queue = celery_env["TS_TEST_QUEUE"]
    env = {**celery_env, "TOKEN_SERVICE_REDIS_URL": redis_server.url, "EXAMPLE_QUEUE": queue}
    run = subprocess.run(
        [sys.executable, "-m", "examples.celery_app"],
        env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len([line for line in lines if "'sent_to': 'ada@example.com'" in line]) == 2
    assert len([line for line in lines if "'charged': 1250" in line]) == 2
    happened = next(line for line in lines if line.startswith("what actually happened:"))
    assert happened.count("receipt order-") == 1
    assert happened.count("charged 1250") == 1


def test_with_the_keys_store_down_the_body_never_runs_and_the_message_is_retried(
    worker: Worker, tasks: Any
) -> None:
    result = tasks.store_down.delay("x")
    with pytest.raises(Exception, match="unavailable") as down:
        result.get(timeout=60)
    assert type(down.value).__name__ == "ServiceUnavailable"
    assert worker.log().count("the keys' store is unavailable; retrying") == 3  # the first try and 2 retries
    assert tasks.counters.get("runs:store_down:x") is None
