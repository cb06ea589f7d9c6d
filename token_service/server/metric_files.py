"""The metric files the gunicorn workers share: bounded across worker restarts.

In multiprocess mode every worker writes its samples to ``<kind>_<pid>.db`` in
``PROMETHEUS_MULTIPROC_DIR`` and a scrape adds up every file, the dead
workers' included, so that counts survive a restart. Left alone, that
directory grows with every worker that ever lived, and so would the label
values a worker picks on its own (client-chosen scopes). Two things keep both
bounded however often workers are replaced:

- :class:`SharedScopeLabels`: the scopes that get a label of their own are
  chosen once for the whole instance, in a list file beside the samples, so a
  new worker extends the same list instead of starting its own. Only the
  configuration (``TOKEN_SERVICE_METRIC_SCOPES``) and authenticated calls
  (consume, begin) add to it; anonymous ones (generate) only read it.
- :func:`fold_dead_worker`: when a worker exits, the master adds its counter
  and histogram samples into one ``<kind>_archive.db`` per kind and deletes
  the worker's files. Scrapes read under a shared lock and the fold holds the
  exclusive one, so a scrape never sees a sample twice or not at all (either
  would look like a counter reset to Prometheus).
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client.mmap_dict import MmapedDict

__all__ = [
    "FORWARDED_FLAG_FILE",
    "LOCK_FILE",
    "OTHER_SCOPE",
    "SCOPES_FILE",
    "ScopeLabels",
    "SharedScopeLabels",
    "fold_dead_worker",
    "multiprocess_dir",
    "reading",
    "scope_labels",
]

OTHER_SCOPE = "_other"
SCOPES_FILE = "scopes.list"
LOCK_FILE = "metrics.lock"
# created by the first worker that sees X-Forwarded-For while TRUSTED_PROXY_HOPS is 0
# (token_service/server/proxies.py): the directory is the one state every worker shares
FORWARDED_FLAG_FILE = "forwarded-for-seen"
# Gauges are not folded: their per-process modes (live*, min, max) do not add up.
_FOLDED_KINDS = ("counter", "histogram")


def multiprocess_dir() -> Path | None:
    value = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    return Path(value) if value else None


@contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), mode)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


@contextmanager
def reading(directory: Path | None) -> Iterator[None]:
    """Hold while collecting: no fold moves samples between files meanwhile."""
    if directory is None:
        yield
        return
    with _flock(directory / LOCK_FILE, fcntl.LOCK_SH):
        yield


def fold_dead_worker(pid: int, directory: Path) -> None:
    """Add a dead worker's counters and histograms to the archive files, then delete its files."""
    with _flock(directory / LOCK_FILE, fcntl.LOCK_EX):
        for kind in _FOLDED_KINDS:
            dead = directory / f"{kind}_{pid}.db"
            if not dead.exists():
                continue
            archive = MmapedDict(str(directory / f"{kind}_archive.db"))  # type: ignore[no-untyped-call]
            try:
                for key, value, _timestamp, _pos in MmapedDict.read_all_values_from_file(str(dead)):  # type: ignore[no-untyped-call]
                    current, _ = archive.read_value(key)  # type: ignore[no-untyped-call]
                    archive.write_value(key, current + value, 0.0)  # type: ignore[no-untyped-call]
            finally:
                archive.close()  # type: ignore[no-untyped-call]
            dead.unlink()


class ScopeLabels:
    """Scopes as label values, at most ``limit`` distinct ones in this process.

    Only an authenticated call admits a scope (:meth:`__call__`: consume and begin,
    which need a service key) or the configuration lists it (``listed``, admitted
    first, in order); an anonymous one (generate) only reads (:meth:`known`), so
    no stranger's scopes can use up the slots.
    """

    def __init__(self, limit: int, listed: tuple[str, ...] = ()) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._full = False
        self._lock = threading.Lock()
        for scope in listed:
            self(scope)

    def __call__(self, scope: str) -> str:
        """The scope's label, admitting it while there is room (an authenticated caller's scope)."""
        if scope in self._seen:
            return scope
        if self._full:
            return OTHER_SCOPE
        with self._lock:
            if self._admit(scope):
                self._seen.add(scope)
                return scope
            self._full = True
        return OTHER_SCOPE

    def known(self, scope: str) -> str:
        """The scope's label if it has one already, else ``_other``: admits nothing."""
        if scope in self._seen or (not self._full and self._refresh(scope)):
            return scope
        return OTHER_SCOPE

    def _admit(self, scope: str) -> bool:
        return len(self._seen) < self.limit

    def _refresh(self, scope: str) -> bool:
        return False  # one process: what it admitted is all there is


class SharedScopeLabels(ScopeLabels):
    """The same bound for every worker of an instance, past and future: the list is a file.

    Each worker reads the list when it meets a scope it has not seen, until the
    list is full; after that an unknown scope costs nothing (``_other``). A
    scope another worker admitted is read from the list (when the file has grown
    since this worker last read it), so every worker labels it alike.
    """

    def __init__(self, limit: int, directory: Path, listed: tuple[str, ...] = ()) -> None:
        self._path = directory / SCOPES_FILE
        self._read_bytes = -1
        super().__init__(limit, listed)

    def _admit(self, scope: str) -> bool:
        with _flock(self._path.with_suffix(".lock"), fcntl.LOCK_EX):
            listed = self._read()
            self._seen.update(listed[: self.limit])
            if scope in self._seen:
                return True
            if len(listed) >= self.limit:
                return False
            with open(self._path, "a", encoding="utf-8") as handle:
                handle.write(scope + "\n")
            return True

    def _refresh(self, scope: str) -> bool:
        try:
            size = self._path.stat().st_size
        except FileNotFoundError:
            return False
        if size == self._read_bytes:
            return False  # nothing admitted since the last read: no lock, no read
        with self._lock, _flock(self._path.with_suffix(".lock"), fcntl.LOCK_SH):
            listed = self._read()
            self._seen.update(listed[: self.limit])
            self._full = len(listed) >= self.limit
        return scope in self._seen

    def _read(self) -> list[str]:
        try:
            text = self._path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        self._read_bytes = len(text.encode("utf-8"))
        return [line for line in text.split("\n") if line]


def scope_labels(limit: int, listed: tuple[str, ...] = ()) -> ScopeLabels:
    """Per process without a shared directory (tests, ``flask run``), per instance under gunicorn."""
    directory = multiprocess_dir()
    return SharedScopeLabels(limit, directory, listed) if directory else ScopeLabels(limit, listed)
