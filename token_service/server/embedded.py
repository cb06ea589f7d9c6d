"""Under gunicorn, one process serves the embedded in-memory store, however gunicorn was started.

The embedded store (no ``TOKEN_SERVICE_REDIS_URL``) lives in the memory of
one process. Two workers would each have a store of their own, and a token
issued by one would be unknown to the other. ``token-service serve`` runs
one worker on it; this module refuses the others ways to get a second one
(``gunicorn -w 2 'token_service:create_app()'``, a config of one's own,
``--preload``): the first worker to load the app holds a lock named after
its gunicorn master for as long as it lives, and a second one fails to start
with a message that says what to do, which stops gunicorn. A worker that
replaces one that died takes the lock over.
"""

from __future__ import annotations

import fcntl
import os
import sys
import tempfile
from pathlib import Path
from types import FrameType

__all__ = [
    "APP_LOAD_ERROR",
    "MESSAGE",
    "SecondWorker",
    "claim",
    "guard_one_worker",
    "lock_path",
    "under_gunicorn",
]

MESSAGE = (
    "token-service: the embedded in-memory store lives in one process and another gunicorn "
    "worker of this server already serves it: run one worker (--workers 1, or `token-service "
    "serve`) or set TOKEN_SERVICE_REDIS_URL"
)
# gunicorn exits with this status when the app fails to load, and stops the server
APP_LOAD_ERROR = 4

_held: dict[int, int] = {}  # master pid → the lock's file descriptor, held until this process ends


class SecondWorker(Exception):
    """Another worker of the same gunicorn master already serves the embedded store."""


def under_gunicorn() -> bool:
    return os.environ.get("SERVER_SOFTWARE", "").startswith("gunicorn/")


def lock_path(master_pid: int) -> Path:
    return Path(tempfile.gettempdir()) / f"token-service-embedded-{master_pid}.lock"


def claim(master_pid: int) -> None:
    """Hold the one claim on the embedded store of gunicorn ``master_pid``, or raise SecondWorker."""
    if master_pid in _held:
        return  # this process holds it already (another app in the same worker)
    descriptor = os.open(lock_path(master_pid), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise SecondWorker(MESSAGE) from None
    _held[master_pid] = descriptor  # never closed: the kernel releases it when the process ends


def _in_a_worker() -> bool:
    """Whether a gunicorn worker is loading the app (else the master, with --preload)."""
    frame: FrameType | None = sys._getframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "init_process" and f"gunicorn{os.sep}workers" in code.co_filename:
            return True
        frame = frame.f_back
    return False


def _claim_in_forked_worker() -> None:
    try:
        claim(os.getppid())
    except SecondWorker as exc:
        print(exc, file=sys.stderr, flush=True)
        os._exit(APP_LOAD_ERROR)


def guard_one_worker() -> None:
    """Called where the embedded store is made: under gunicorn, make sure one worker serves it.

    In a worker (the usual case) the claim is taken now, so a second worker
    fails to load the app. With ``--preload`` the master makes the store and
    the workers inherit copies of it: each claims when it is forked.
    """
    if not under_gunicorn():
        return
    if _in_a_worker():
        claim(os.getppid())
    else:
        os.register_at_fork(after_in_child=_claim_in_forked_worker)
