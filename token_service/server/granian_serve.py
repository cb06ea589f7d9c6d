"""``token-service serve --server granian``: the same WSGI app (``create_app()``) under granian.

granian (the ``granian`` extra) is a Rust HTTP server; its WSGI workers call the app on a few
Python threads each. This module does around it what token_service/server/gunicorn_conf.py does
around gunicorn, and the reasons are the same:

- **Settings first**: validated before anything starts (cli.py), exit status 2 on a bad one.
- **Metrics**: ``PROMETHEUS_MULTIPROC_DIR`` is set (a fresh temporary directory unless the
  operator set one, which is emptied) before granian spawns its workers, so /metrics adds up
  every worker's samples. granian has no per-worker exit hook: a worker it respawns leaves its
  files behind, still counted (nothing is lost or counted twice), but not folded into the archive.
- **Draining**: granian runs as a child of this process. On SIGTERM this process touches the
  drain file (``/readyz`` answers 503) and waits TOKEN_SERVICE_DRAIN_SECONDS while granian keeps
  serving, then sends granian SIGTERM, whose graceful stop lets requests in flight finish
  (``--workers-kill-timeout`` 10 s, gunicorn's ``graceful_timeout``). A second SIGTERM, or
  SIGINT, skips the wait.
- **Slow clients**: a request's head must be in within 5 s (``--http1-header-read-timeout``,
  gunicorn's ``keepalive``), and be at most 8 KiB (``--http1-buffer-size``, its smallest: 431
  beyond, as gunicorn answers a header line over 8190 bytes).
- **Only behind a proxy**: what granian does not hold of the edge gunicorn holds -- above all a
  deadline for a request body (a stalled body holds one of the worker's blocking threads for as
  long as the client likes: ``wsgi.input`` is granian's, with no socket to time out, and granian
  has no body timeout of its own, emmett-framework/granian#728) -- the nginx recipe (or the
  Kubernetes recipe's Ingress) holds in front of it: it reads the whole request before passing it
  on. So ``serve`` refuses to bind an address other than loopback unless
  TOKEN_SERVICE_TRUSTED_PROXY_HOPS says a proxy is in front, and says at every start what it
  relies on the proxy for (docs/deployment.md, "granian: only behind the proxy").
- **HTTP/1.1 only, no WebSockets**: the service speaks neither HTTP/2 nor WebSockets, so neither
  is offered to a client (less parser to attack).
- **Logs**: granian's messages and the app's go through the same logging config as under
  gunicorn (JSON or console, one line each on stderr); the app writes the access lines itself
  (``token_service.access``), so granian's access log stays off.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import logging.config
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import FrameType

from token_service.config import Settings
from token_service.server.logs import logging_config
from token_service.server.metric_files import FORWARDED_FLAG_FILE

__all__ = [
    "BLOCKING_THREADS",
    "HEADER_BUFFER_BYTES",
    "HEADER_READ_TIMEOUT_MILLISECONDS",
    "WORKERS_KILL_TIMEOUT_SECONDS",
    "exposure_refused",
    "granian_argv",
    "serve",
]

# Python threads per worker that run the app. Two per worker keep a core busy while one of them
# waits on Redis (benchmarks/RESULTS.md); more only add GIL contention.
BLOCKING_THREADS = 2
# gunicorn's keepalive (5 s): the deadline for a request's head, the first one too.
HEADER_READ_TIMEOUT_MILLISECONDS = 5000
# A request's whole head (request line and headers) is at most this: 431 beyond. granian's smallest
# read buffer; gunicorn refuses a header line over 8190 bytes (limit_request_field_size).
HEADER_BUFFER_BYTES = 8192
# gunicorn's graceful_timeout: requests in flight get this long at shutdown.
WORKERS_KILL_TIMEOUT_SECONDS = 10

log = logging.getLogger("token_service.server.granian")


def granian_logging_config(level: str, log_format: str) -> dict[str, object]:
    """The app's logging config with granian's loggers in place of gunicorn's."""
    config = logging_config(level, log_format)
    filters = dict(config["filters"])
    filters.pop("redact_gunicorn", None)  # gunicorn's messages only
    config["filters"] = filters
    config["loggers"] = {
        "_granian": {"level": level, "handlers": ["json"], "propagate": False},
        # the app writes the access lines (token_service.access); granian's own would be a second copy
        "granian.access": {"level": "WARNING", "handlers": [], "propagate": False},
    }
    return config


def granian_argv(host: str, port: int, workers: int, log_config_path: Path, level: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "granian",
        "--interface",
        "wsgi",
        "--factory",
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--blocking-threads",
        str(BLOCKING_THREADS),
        "--http",
        "1",
        "--no-ws",
        "--http1-header-read-timeout",
        str(HEADER_READ_TIMEOUT_MILLISECONDS),
        "--http1-buffer-size",
        str(HEADER_BUFFER_BYTES),
        "--workers-kill-timeout",
        str(WORKERS_KILL_TIMEOUT_SECONDS),
        "--respawn-failed-workers",
        "--no-access-log",
        "--log-level",
        level.lower(),
        "--log-config",
        str(log_config_path),
        "token_service:create_app",
    ]


# What granian relies on the proxy in front for (docs/deployment.md, "granian: only behind the proxy").
RELIES_ON_THE_PROXY = (
    "granian holds no deadline for a request body (a stalled or dripping body holds a blocking "
    "thread for as long as its client likes), accepts a bare LF as a line end, and answers its own "
    "refusals without problem+json: it relies on the proxy in front (the nginx recipe, or the "
    "Kubernetes Ingress) to read each whole request first. Never let clients reach this port directly"
)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it could resolve to anything
        return False


def exposure_refused(settings: Settings, host: str) -> str | None:
    """Why granian must not bind ``host`` with these settings, or None when it may.

    On loopback only local processes reach it (the nginx recipe on the same host); elsewhere a
    proxy must be declared in front (TOKEN_SERVICE_TRUSTED_PROXY_HOPS, which the Kubernetes
    recipe and the nginx recipe's service already set), since clients reaching granian directly
    could hold every blocking thread with bodies that never end.
    """
    if _is_loopback(host) or settings.trusted_proxy_hops > 0:
        return None
    return (
        f"token-service: --server granian on {host} needs a proxy in front of it, and "
        "TOKEN_SERVICE_TRUSTED_PROXY_HOPS=0 says there is none. "
        f"{RELIES_ON_THE_PROXY}. Put it behind the nginx recipe (deploy/nginx) and set "
        "TOKEN_SERVICE_TRUSTED_PROXY_HOPS=1, bind 127.0.0.1, or serve with gunicorn (the default), "
        "which holds these itself (docs/deployment.md)."
    )


def serve(settings: Settings, host: str, port: int, workers: int | None) -> int:
    """Run granian until it stops; its exit status."""
    refused = exposure_refused(settings, host)
    if refused:
        print(refused, file=sys.stderr)
        return 2
    try:
        import flask  # noqa: F401 — what the workers import, checked before granian spawns them
        import granian  # noqa: F401
    except ImportError as exc:
        print(
            "token-service: --server granian needs the granian extra "
            f"(pip install 'idempotency-token-service[server,granian]'): {exc}",
            file=sys.stderr,
        )
        return 2
    config = granian_logging_config(settings.log_level, settings.log_format)
    logging.config.dictConfig(config)
    log.warning("%s (docs/deployment.md).", RELIES_ON_THE_PROXY)

    own_metrics_dir = not os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if own_metrics_dir:
        shm = "/dev/shm"  # noqa: S108 — metric samples, not user data: a tmpfs where there is one
        root = shm if os.path.isdir(shm) else tempfile.gettempdir()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="token-service-metrics-", dir=root)
    metrics_dir = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    metrics_dir.mkdir(parents=True, exist_ok=True)
    # samples left by a previous run would be added to this one's
    for stale in [*metrics_dir.glob("*.db"), *metrics_dir.glob("scopes.*")]:
        stale.unlink()
    (metrics_dir / FORWARDED_FLAG_FILE).unlink(missing_ok=True)
    if not settings.drain_file:
        os.environ["TOKEN_SERVICE_DRAIN_FILE"] = str(metrics_dir / "draining")
    drain_file = Path(os.environ["TOKEN_SERVICE_DRAIN_FILE"])
    drain_file.unlink(missing_ok=True)

    log_config_path = metrics_dir / "granian-logging.json"
    log_config_path.write_text(json.dumps(config), encoding="utf-8")
    workers = workers or int(os.environ.get("WEB_CONCURRENCY") or os.cpu_count() or 2)
    argv = granian_argv(host, port, workers, log_config_path, settings.log_level)
    child = subprocess.Popen(argv)

    def stop_now() -> None:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)

    def on_term(signum: int, frame: FrameType | None) -> None:
        if settings.drain_seconds <= 0 or drain_file.exists():
            stop_now()  # no drain configured, or a second SIGTERM: stop now
            return
        drain_file.touch()
        log.info("SIGTERM: draining for %d s (/readyz now fails)", settings.drain_seconds)
        signal.signal(signal.SIGALRM, lambda signum, frame: stop_now())
        signal.alarm(settings.drain_seconds)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, lambda signum, frame: stop_now())
    try:
        while True:
            try:
                return child.wait()
            except InterruptedError:  # pragma: no cover — PEP 475 retries; kept for clarity
                continue
    finally:
        drain_file.unlink(missing_ok=True)
        log_config_path.unlink(missing_ok=True)
        if own_metrics_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)
