"""Metric files under worker churn: scope labels stay bounded, dead workers' files are folded, counts kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.edge.test_gunicorn import counter
from tests.support.processes import Gunicorn, RedisServer, children, wait_until
from tests.support.service import API_KEY, AUTH
from token_service.server.metric_files import (
    OTHER_SCOPE,
    SharedScopeLabels,
    fold_dead_worker,
    reading,
)
from token_service.server.metrics import MAX_SCOPES


def test_workers_share_one_bound_on_scope_labels(tmp_path: Path) -> None:
    first = SharedScopeLabels(3, tmp_path)
    assert [first(s) for s in ("a", "b")] == ["a", "b"]
    # a worker started later extends the same list instead of starting its own
    later = SharedScopeLabels(3, tmp_path)
    assert [later(s) for s in ("c", "d", "a")] == ["c", OTHER_SCOPE, "a"]
    # and the first worker learns that the list is full
    assert [first(s) for s in ("c", "e")] == ["c", OTHER_SCOPE]
    assert (tmp_path / "scopes.list").read_text().split() == ["a", "b", "c"]


def _write_samples(directory: Path, increments: dict[str, int]) -> None:
    """A worker process: counts scopes in multiprocess mode, then exits (its files stay)."""
    script = textwrap.dedent(
        f"""
        from prometheus_client import Counter, Histogram
        issued = Counter("folded_issued", "test", ["scope"])
        latency = Histogram("folded_latency_seconds", "test", buckets=(0.1, 1.0))
        for scope, n in {increments!r}.items():
            issued.labels(scope).inc(n)
            for _ in range(n):
                latency.observe(0.5)
        """
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def _scrape(directory: Path) -> str:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    script = (
        "from prometheus_client import CollectorRegistry, generate_latest, multiprocess\n"
        "r = CollectorRegistry(); multiprocess.MultiProcessCollector(r)\n"
        "print(generate_latest(r).decode())"
    )
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    return done.stdout


def test_folding_dead_workers_keeps_every_count_and_one_file_per_kind(tmp_path: Path) -> None:
    for increments in ({"a": 2, "b": 1}, {"a": 3}, {"c": 4}):
        _write_samples(tmp_path, increments)
    before = _scrape(tmp_path)
    pids = {int(f.stem.split("_")[1]) for f in tmp_path.glob("counter_*.db")}
    assert len(pids) == 3

    for pid in pids:
        fold_dead_worker(pid, tmp_path)

    assert sorted(f.name for f in tmp_path.glob("*.db")) == ["counter_archive.db", "histogram_archive.db"]
    after = _scrape(tmp_path)
    assert counter(after, "folded_issued_total", scope="a") == 5
    assert counter(after, "folded_issued_total", scope="c") == 4
    assert counter(after, "folded_latency_seconds_bucket", le="1.0") == 10
    assert "folded_latency_seconds_count 10.0" in after.splitlines()
    assert sorted(before.splitlines()) == sorted(after.splitlines())


def test_a_scrape_waits_for_a_fold_in_progress(tmp_path: Path) -> None:
    """The fold holds the lock exclusively: a scrape under ``reading`` never sees a half-moved sample."""
    import fcntl

    lock = tmp_path / "metrics.lock"
    with open(lock, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        probe = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from pathlib import Path\n"
                "from token_service.server.metric_files import reading\n"
                "print('reading', flush=True)\n"
                f"with reading(Path({str(tmp_path)!r})): print('read')",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert probe.stdout is not None
        # once it got as far as reading (a loaded machine may take seconds to start it), it waits
        assert probe.stdout.readline().strip() == "reading"
        with pytest.raises(subprocess.TimeoutExpired):
            probe.wait(timeout=1)
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    out, _ = probe.communicate(timeout=30)
    assert out.strip() == "read"
    with reading(tmp_path):  # and the lead's own reads do not deadlock on themselves
        pass


def test_a_worker_exit_during_another_workers_fold_is_folded_too(tmp_path: Path) -> None:
    """gunicorn before 24 calls child_exit inside its SIGCHLD handler, so a second exit can
    interrupt the first fold. The nested call must neither re-enter the fold (it would wait
    forever on the lock its own process holds) nor fail, and both workers' counts must land."""
    for increments in ({"a": 2}, {"b": 3}):
        _write_samples(tmp_path, increments)
    first, second = sorted(int(f.stem.split("_")[1]) for f in tmp_path.glob("counter_*.db"))
    script = textwrap.dedent(
        f"""
        import types
        from token_service.server import gunicorn_conf, metric_files

        fold = metric_files.fold_dead_worker
        server = types.SimpleNamespace(log=None)

        def fold_then_interrupt(pid, directory):
            if pid == {first}:  # the second worker exits while the first one's files are locked
                with metric_files._flock(directory / metric_files.LOCK_FILE, metric_files.fcntl.LOCK_EX):
                    gunicorn_conf.child_exit(server, types.SimpleNamespace(pid={second}))
            fold(pid, directory)

        gunicorn_conf.fold_dead_worker = fold_then_interrupt
        gunicorn_conf.child_exit(server, types.SimpleNamespace(pid={first}))
        print("done")
        """
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TOKEN_SERVICE_")},
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done"
    assert sorted(f.name for f in tmp_path.glob("counter_*.db")) == ["counter_archive.db"]
    after = _scrape(tmp_path)
    assert counter(after, "folded_issued_total", scope="a") == 2
    assert counter(after, "folded_issued_total", scope="b") == 3


@pytest.fixture
def churned_service(tmp_path: Path) -> Iterator[tuple[Gunicorn, Path]]:
    redis_server = RedisServer().start()
    server = Gunicorn(
        {
            "TOKEN_SERVICE_REDIS_URL": redis_server.url,
            "TOKEN_SERVICE_API_KEYS": API_KEY,
            "TOKEN_SERVICE_RATE_LIMIT": "off",
            "TOKEN_SERVICE_MAX_OUTSTANDING_PER_SUBJECT": "0",  # no cap
            "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
        },
        workers=2,
    ).start()
    yield server, tmp_path
    server.stop()
    redis_server.stop()


@pytest.mark.real
@pytest.mark.slow
def test_scope_labels_and_files_stay_bounded_across_worker_restarts(
    churned_service: tuple[Gunicorn, Path],
) -> None:
    server, metrics_dir = churned_service
    assert server.process is not None
    master = server.process.pid
    cycles, scopes_per_cycle = 6, 20
    issued = 0
    with httpx.Client(base_url=server.url, timeout=10) as http:
        for cycle in range(cycles):
            workers = children(master)
            assert len(workers) == 2
            for n in range(scopes_per_cycle):
                scope = f"churn.c{cycle}.s{n}"
                reply = http.post("/token/generate", json={"scope": scope})
                assert reply.status_code == 201, reply.text
                issued += 1
                # a consume (a service key) is what gives a scope a label; an anonymous generate never does
                used = {"token": reply.json()["token"], "scope": scope}
                assert http.post("/token/consume", json=used, headers=AUTH).status_code == 200
            victim = sorted(workers)[0]
            os.kill(victim, signal.SIGKILL)
            wait_until(
                lambda victim=victim: victim not in children(master) and len(children(master)) == 2,
                timeout_seconds=60,
                what="a replacement worker",
            )
        wait_until(lambda: http.get("/healthz").status_code == 200, timeout_seconds=60, what="service")
        text = http.get("/metrics").text

    scopes = set()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("token_service_tokens_issued_total{"):
            scopes.add(line.split('scope="', 1)[1].split('"', 1)[0])
            total += float(line.rpartition(" ")[2])
    # 120 distinct scopes were used; the instance labels at most MAX_SCOPES of them, however many workers
    assert cycles * scopes_per_cycle > MAX_SCOPES + 1
    assert len(scopes) <= MAX_SCOPES + 1
    assert OTHER_SCOPE in scopes
    # nothing lost in the folding: every token issued is counted once
    assert total == issued
    # files: the two live workers' and one archive per kind, not one per worker that ever lived
    counter_files = sorted(f.name for f in metrics_dir.glob("counter_*.db"))
    assert len(counter_files) <= 3, counter_files
    assert "counter_archive.db" in counter_files
