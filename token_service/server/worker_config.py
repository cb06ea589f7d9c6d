"""gunicorn's settings as a worker reads them: each looked up once, then a plain attribute.

A gunicorn worker reads its settings (``worker.cfg``) about twenty times a
request -- the parser's limits, ``is_ssl``, the forwarded-header rules,
``keepalive`` -- and every read of a ``Config`` runs ``Config.__getattr__``
and the setting's ``get()`` (what that costs a request: docs/performance.md,
step 6). A worker's settings cannot change while it lives (a
reload replaces the workers), so :class:`FrozenConfig` keeps each value
after its first read.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FrozenConfig", "install"]


class FrozenConfig:
    """A gunicorn ``Config`` whose every attribute is looked up once (then kept in this object)."""

    def __init__(self, config: Any) -> None:
        self.__dict__["_config"] = config

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.__dict__["_config"], name)
        if not name.startswith("__"):
            self.__dict__[name] = value
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.__dict__["_config"], name, value)
        self.__dict__.pop(name, None)

    def set(self, name: str, value: Any) -> None:
        """``Config.set``; the value is read anew (gunicorn does not change a worker's settings)."""
        self.__dict__["_config"].set(name, value)
        self.__dict__.pop(name, None)

    def __str__(self) -> str:
        return str(self.__dict__["_config"])


def install(worker: Any) -> None:
    """In ``post_fork``: the worker reads its settings through a :class:`FrozenConfig`."""
    if not isinstance(worker.cfg, FrozenConfig):
        worker.cfg = FrozenConfig(worker.cfg)
