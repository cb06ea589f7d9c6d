"""The testing kit: your tests run our Lua on an in-memory store, on a clock they move.

With the ``client`` extra installed, pytest finds the fixtures without a
conftest (the ``token_service`` plugin, :mod:`token_service.testing.plugin`):
``token_client`` / ``async_token_client`` (the SDK's clients on a store of the
test's own), ``token_clock`` (``advance(seconds)``: tokens, leases and stored
results expire as they would, with no sleeping), ``token_faults`` (the store
down, an operation in flight elsewhere, a holder that crashes) and
``token_store`` (the store itself: Redis clients for the integrations).
Outside pytest, :class:`InMemoryStore` is the same store. The page
``docs/testing-your-code.md`` shows each integration tested with it.

No Redis and no service: fakeredis runs the very scripts production runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._clock import StoreClock
    from ._faults import InFlight, StoreFaults
    from ._store import InMemoryStore, StoreClosed

__all__ = ["InFlight", "InMemoryStore", "StoreClock", "StoreClosed", "StoreFaults"]

# Imported on first use: the pytest plugin (token_service.testing.plugin) lives in this package
# and must load, through the entry point, wherever the wheel is installed, fakeredis or not.
_HOMES = {
    "InFlight": "._faults",
    "InMemoryStore": "._store",
    "StoreClock": "._clock",
    "StoreClosed": "._store",
    "StoreFaults": "._faults",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home, __name__), name)
