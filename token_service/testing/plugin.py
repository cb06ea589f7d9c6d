"""The ``token_service`` pytest plugin: the testing kit's fixtures, found without a conftest.

Registered through the ``pytest11`` entry point, so a suite gets these
fixtures once the package is installed (each described on the page "Testing
your code", ``docs/testing-your-code.md``):

- ``token_store`` — the in-memory store (:class:`~token_service.testing.InMemoryStore`),
  emptied for each test: ``redis()`` / ``async_redis()`` for what takes a Redis client;
- ``token_client`` / ``async_token_client`` — a :class:`~token_service.client.TokenClient`
  / :class:`~token_service.client.AsyncTokenClient` on it, the same API as in production;
- ``token_clock`` — its :class:`~token_service.testing.StoreClock` (``advance(seconds)``);
- ``token_faults`` — its :class:`~token_service.testing.StoreFaults` (``store_down()``,
  ``in_flight(...)``, ``in_flight_key(...)``).

This module imports only pytest: the kit itself (fakeredis, lupa, which the
``client`` extra installs) is imported when a test first asks for a fixture, so
a suite that uses none of them runs wherever the package is installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

try:
    import pytest
except ModuleNotFoundError as exc:  # tests/testing/test_kit_misuse.py
    # the words of token_service.client._extras.missing, without importing the SDK here: the
    # plugin loads in every pytest run of an environment that has the wheel, kit used or not
    if exc.name != "pytest":
        raise
    raise ModuleNotFoundError(
        "token_service.testing.plugin, a pytest plugin, needs 'pytest', which is not installed: "
        "pip install pytest (outside pytest, use token_service.testing.InMemoryStore)",
        name="pytest",
    ) from exc

if TYPE_CHECKING:
    from token_service.client import AsyncTokenClient, TokenClient
    from token_service.testing import InMemoryStore, StoreClock, StoreFaults

__all__ = ["async_token_client", "token_client", "token_clock", "token_faults", "token_store"]


@pytest.fixture(scope="session")
def _token_service_store() -> InMemoryStore:
    """One store per test process, emptied before each test (see ``token_store``)."""
    from token_service.testing import InMemoryStore

    return InMemoryStore()


@pytest.fixture
def token_store(
    _token_service_store: InMemoryStore, request: pytest.FixtureRequest
) -> Iterator[InMemoryStore]:
    """The in-memory store of this test: empty, on this host's time, no fault switched on."""
    _token_service_store.reset(request.node.nodeid)
    yield _token_service_store
    _token_service_store.reset()  # what the test left (a fault, time moved) ends with it


@pytest.fixture
def token_client(token_store: InMemoryStore) -> Iterator[TokenClient]:
    """A TokenClient on this test's in-memory store (``TokenClient.from_redis``)."""
    with token_store.client() as client:
        yield client


@pytest.fixture
def async_token_client(token_store: InMemoryStore) -> AsyncTokenClient:
    """An AsyncTokenClient on this test's in-memory store, for the test's event loop."""
    return token_store.async_client()


@pytest.fixture
def token_clock(token_store: InMemoryStore) -> StoreClock:
    """The store's clock: ``token_clock.advance(seconds)`` moves its time forward."""
    return token_store.clock


@pytest.fixture
def token_faults(token_store: InMemoryStore) -> StoreFaults:
    """The store's faults: ``store_down()``, ``in_flight(token, scope)``, ``in_flight_key(scope, key)``."""
    return token_store.faults
