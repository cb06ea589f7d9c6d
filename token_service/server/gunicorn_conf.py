"""gunicorn settings for token-service (``gunicorn -c python:token_service.server.gunicorn_conf``).

Every choice here can be overridden the usual gunicorn ways (command line,
``GUNICORN_CMD_ARGS``); the reasons:

- **Configuration first.** The ``TOKEN_SERVICE_*`` settings are validated
  here, in the master, before any worker starts: a bad value stops start-up
  with one line naming the variable (exit status 2), not a worker crash loop.
- **gevent workers, one per core** (``WEB_CONCURRENCY``, else the CPU count),
  ``worker_connections`` 1000 each. A request is a little CPU and one or two
  Redis round trips of well under a millisecond, so processes keep the cores
  busy; within a process, gevent holds each connection as a greenlet, so an
  idle or slow client costs memory, not a worker (a sync worker is stopped by
  one idle socket, a gthread worker by ``--threads`` of them), and
  connections are kept alive. benchmarks/RESULTS.md compares sync, gthread and
  gevent on the same app: docs/performance.md says why gevent won.
- **Slow clients.** ``keepalive`` 5 s is also the deadline for a request's
  head (gunicorn's gevent worker reads every head, the first one too, under
  it): a client that has not sent its head by then is disconnected.
  TOKEN_SERVICE_BODY_TIMEOUT_SECONDS (default 10) is the body's
  (token_service/server/body.py: 408 problem+json), and
  TOKEN_SERVICE_SEND_TIMEOUT_SECONDS (default 15) the reply's: a client
  that does not read its replies is disconnected
  (token_service/server/connections.py).
- **gunicorn's own request parser** (``http_parser`` "python"), even where
  gunicorn_h1c (``gunicorn[fast]``) is installed, which gunicorn >= 25
  would otherwise pick: its release at hand (0.6.9) accepts a bare LF as a
  line end and obsolete line folding, both of which gunicorn's parser refuses
  (400) -- room for a proxy in front and the service to read one request two
  ways, and an obs-fold line reaches gunicorn as a header with an empty
  name. What it would save of a token request's worker CPU is small
  (measured in docs/performance.md).
- **Errors before the app.** gunicorn's own error replies (a request it
  cannot parse, a header too large, a worker timeout) are problem+json, not
  its HTML pages (``post_fork``, token_service/server/gunicorn_errors.py).
- **Timeouts.** ``timeout`` 30 s kills a worker stuck that long (a request
  needs milliseconds; Redis calls time out after TOKEN_SERVICE_REDIS_TIMEOUT_SECONDS).
  ``graceful_timeout`` 10 s lets requests in flight finish on shutdown.
- **Draining.** On SIGTERM the master first marks the instance as draining --
  ``/readyz`` answers 503 -- and keeps serving for TOKEN_SERVICE_DRAIN_SECONDS
  (default 0; the Docker image sets 5) so the load balancer stops sending
  traffic; then the normal graceful stop runs. A second SIGTERM, or SIGINT /
  SIGQUIT, skips the wait. The orchestrator's stop timeout must exceed
  drain + graceful_timeout.
- **Connections spread over the workers.** With keep-alive a connection
  stays with the worker that accepted it, and a client opening a few at
  once used to leave most of them on one worker (6 + 2 or worse of wrk's 8
  in half the runs): a gevent worker about to accept while another holds fewer
  connections lets that one take it first (``pre_fork``, ``post_fork``,
  token_service/server/accepts.py).
- **Settings read once.** A worker reads its settings about twenty times
  a request, each read through gunicorn's ``Config.__getattr__``; in
  ``post_fork`` they become plain attributes after the first read
  (token_service/server/worker_config.py).
- **worker_tmp_dir** on /dev/shm: the workers' heartbeat files are touched
  constantly and must not sit on a slow overlay disk.
- **Metrics.** ``PROMETHEUS_MULTIPROC_DIR`` is set (a fresh temporary
  directory unless the operator set one, which is emptied) before any worker
  imports prometheus_client; ``child_exit`` tells the collector a worker died.
- **Logs.** One JSON object per line on stderr for gunicorn and the app; the
  app writes the access lines itself (with request ids), so gunicorn's access
  log is off (and ``logger_class`` stops gunicorn building its fields).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from token_service.config import ConfigError, Settings
from token_service.server import accepts
from token_service.server.gunicorn_logger import GunicornLogger
from token_service.server.logs import logging_config

__all__ = [
    "accesslog",
    "child_exit",
    "control_socket_disable",
    "errorlog",
    "graceful_timeout",
    "http_parser",
    "keepalive",
    "logconfig_dict",
    "logger_class",
    "loglevel",
    "on_exit",
    "on_starting",
    "post_fork",
    "pre_fork",
    "timeout",
    "when_ready",
    "worker_class",
    "worker_connections",
    "worker_tmp_dir",
    "workers",
]

try:
    _settings = Settings.from_env(os.environ)
except ConfigError as _exc:
    print(f"token-service: configuration error: {_exc}", file=sys.stderr)
    raise SystemExit(2) from None

workers = int(os.environ.get("WEB_CONCURRENCY") or os.cpu_count() or 2)
worker_class = "gevent"
worker_connections = 1000
timeout = 30
graceful_timeout = 10
keepalive = 5
_SHM = "/dev/shm"  # noqa: S108 — gunicorn heartbeat files, not user data
worker_tmp_dir = _SHM if os.path.isdir(_SHM) else None

# Unknown to gunicorn < 25, which ignores it and has only this parser.
http_parser = "python"

# No control socket (gunicorn >= 25): every instance of a user would share
# $HOME/.gunicorn/gunicorn.ctl, and it is one more way to steer the master.
control_socket_disable = True

accesslog = None
errorlog = "-"
loglevel = _settings.log_level.lower()
logconfig_dict = logging_config(_settings.log_level, _settings.log_format)

# gunicorn builds its access-log fields for every request whenever a logging config is
# given, even when nothing would write them; this logger skips that work then.
logger_class = GunicornLogger

# --- metrics: one directory shared by the workers, fresh for each start ---------
_tmp_root = worker_tmp_dir or tempfile.gettempdir()
_own_metrics_dir = not os.environ.get("PROMETHEUS_MULTIPROC_DIR")
if _own_metrics_dir:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="token-service-metrics-", dir=_tmp_root)
_metrics_dir = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])

# Imported here, once PROMETHEUS_MULTIPROC_DIR is set (prometheus_client picks its
# value class at import), and not inside child_exit: on gunicorn before 24 that hook
# runs in a signal handler, where a second worker's exit interrupted the first import
# and the nested one failed on the half-initialised module (the master exited 1).
from prometheus_client import multiprocess  # noqa: E402

from token_service.server.metric_files import FORWARDED_FLAG_FILE, fold_dead_worker  # noqa: E402

# --- draining: a flag file the workers' /readyz looks at --------------------------
if not _settings.drain_file:
    os.environ["TOKEN_SERVICE_DRAIN_FILE"] = str(_metrics_dir / "draining")
_drain_file = Path(os.environ["TOKEN_SERVICE_DRAIN_FILE"])


def on_starting(server: Any) -> None:
    # Samples left by a previous run would be added to this one's.
    _metrics_dir.mkdir(parents=True, exist_ok=True)
    for stale in [*_metrics_dir.glob("*.db"), *_metrics_dir.glob("scopes.*")]:
        stale.unlink()
    # and the last run's X-Forwarded-For warning (token_service/server/proxies.py): this run's own
    (_metrics_dir / FORWARDED_FLAG_FILE).unlink(missing_ok=True)
    _drain_file.unlink(missing_ok=True)


def when_ready(server: Any) -> None:
    stop = server.handle_term

    def drain_then_stop() -> None:
        if _settings.drain_seconds <= 0 or _drain_file.exists():
            stop()  # no drain configured, or a second SIGTERM: stop now
            return
        _drain_file.touch()
        server.log.info("SIGTERM: draining for %d s (/readyz now fails)", _settings.drain_seconds)
        # the alarm queues a second SIGTERM, which lands in the branch above
        signal.signal(signal.SIGALRM, lambda signum, frame: server.signal(signal.SIGTERM, frame))
        signal.alarm(_settings.drain_seconds)

    server.handle_term = drain_then_stop


# --- connections spread over the workers (token_service/server/accepts.py) -----------
_accepts = accepts.Table()


def pre_fork(server: Any, worker: Any) -> None:
    worker.accepts_slot = _accepts.claim(getattr(w, "accepts_slot", None) for w in server.WORKERS.values())


def post_fork(server: Any, worker: Any) -> None:
    from token_service.server import connections, gunicorn_errors, worker_config

    gunicorn_errors.install()
    worker_config.install(worker)
    if type(worker).__name__ == "GeventWorker":  # the default; other classes keep gunicorn's handling
        connections.install(worker, _settings.send_timeout_seconds)
        if worker.cfg.workers > 1:
            accepts.install(worker, _accepts, worker.accepts_slot)


# Worker pids whose metric files still have to be folded. gunicorn before 24 reaps
# workers inside its SIGCHLD handler, so a second worker's exit can interrupt the
# fold of the first one: the nested call only queues its pid (folding there would
# wait forever on the file lock its own process holds), and the outer call folds it.
_dead_workers: list[int] = []
_folding = False


def child_exit(server: Any, worker: Any) -> None:
    global _folding
    _accepts.release(getattr(worker, "accepts_slot", None))
    _dead_workers.append(worker.pid)
    if _folding:
        return
    _folding = True
    try:
        while _dead_workers:
            pid = _dead_workers.pop(0)
            try:
                multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
                # its counts move to the archive files, so the directory does not grow with every restart
                fold_dead_worker(pid, _metrics_dir)
            except OSError:
                server.log.exception("could not fold the metric files of worker %d", pid)
    finally:
        _folding = False


def on_exit(server: Any) -> None:
    _drain_file.unlink(missing_ok=True)
    if _own_metrics_dir:
        shutil.rmtree(_metrics_dir, ignore_errors=True)
