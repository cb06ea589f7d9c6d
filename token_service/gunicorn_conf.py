"""gunicorn settings for token-service (``gunicorn -c python:token_service.gunicorn_conf``).

Sync workers: every request is a short Redis round trip, so a process per
core keeps latency flat without an event loop. Workers come from
WEB_CONCURRENCY (the Heroku/Docker convention), else 2.
"""

from __future__ import annotations

import os

workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
worker_class = "sync"
# A request never needs more than a few Redis calls; a hung worker is killed.
timeout = 30
graceful_timeout = 20
keepalive = 5
# Heartbeat files on tmpfs, not the (possibly slow, overlay) container disk.
_SHM = "/dev/shm"  # noqa: S108 — gunicorn heartbeat files, not user data
worker_tmp_dir = _SHM if os.path.isdir(_SHM) else None
accesslog = "-"
errorlog = "-"
