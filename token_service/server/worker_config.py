"""gunicorn's settings as a worker reads them: each looked up once, then a plain attribute; and
what follows from them alone, such as whether a peer address is a trusted proxy, worked out once.

A gunicorn worker reads its settings (``worker.cfg``) about twenty times a
request -- the parser's limits, ``is_ssl``, the forwarded-header rules,
``keepalive`` -- and every read of a ``Config`` runs ``Config.__getattr__``
and the setting's ``get()`` (what that costs a request: docs/performance.md,
step 6). A worker's settings cannot change while it lives (a
reload replaces the workers), so :class:`FrozenConfig` keeps each value
after its first read.

gunicorn (from 24) also decides for every request whether its peer may set
the forwarding headers (``forwarded_allow_ips``): it parses the address with
``ipaddress`` and tests it against each allowed network (its cost:
docs/performance.md). The answer depends on the address and the settings only, so
:func:`install` keeps it per address (for the first :data:`PEERS_REMEMBERED`
addresses a worker meets; any other is worked out every time, as before).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PEERS_REMEMBERED", "FrozenConfig", "install", "remember_peer_trust"]

PEERS_REMEMBERED = 4096


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


def remember_peer_trust(message: Any) -> None:
    """gunicorn's ``message._ip_in_allow_list(address, allow_list, networks)``, its answer kept
    per address and allow list (gunicorn's own lists, which a worker never changes); a gunicorn
    without that function is left as it is."""
    decide = getattr(message, "_ip_in_allow_list", None)
    if decide is None or getattr(decide, "remembers", False):
        return
    # (address, id of the list, id of the networks) -> (the list, the networks, the answer): the
    # objects held, so that their ids are theirs as long as the entry lives
    known: dict[tuple[str, int, int], tuple[Any, Any, bool]] = {}

    def ip_in_allow_list(address: str, allow_list: Any, networks: Any) -> bool:
        key = (address, id(allow_list), id(networks))
        entry = known.get(key)
        if entry is not None and entry[0] is allow_list and entry[1] is networks:
            return entry[2]
        answer = bool(decide(address, allow_list, networks))
        if len(known) < PEERS_REMEMBERED:
            known[key] = (allow_list, networks, answer)
        return answer

    ip_in_allow_list.remembers = True  # type: ignore[attr-defined]
    message._ip_in_allow_list = ip_in_allow_list


def install(worker: Any) -> None:
    """In ``post_fork``: the worker reads its settings through a :class:`FrozenConfig`, and each
    peer address's trust is decided once."""
    if not isinstance(worker.cfg, FrozenConfig):
        worker.cfg = FrozenConfig(worker.cfg)
    from gunicorn.http import message

    remember_peer_trust(message)
