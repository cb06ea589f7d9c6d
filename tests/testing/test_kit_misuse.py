"""Careless and hostile use of the testing kit: each gets an error that says what to do."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from tests.support.processes import REPO_ROOT
from token_service.client import TokenClient, TokenInvalid
from token_service.testing import InMemoryStore, StoreClock, StoreClosed

SCOPE = "payment.create"


@pytest.mark.parametrize("seconds", [-1, -0.001])
def test_time_never_moves_back(token_clock: StoreClock, seconds: float) -> None:
    with pytest.raises(ValueError, match="only moves forward"):
        token_clock.advance(seconds)
    assert token_clock.offset_seconds == 0


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -math.inf])
def test_time_moves_by_finite_amounts(token_clock: StoreClock, seconds: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        token_clock.advance(seconds)
    assert token_clock.offset_seconds == 0


@pytest.mark.parametrize("seconds", ["5", None, True, b"5", [5], 5j])
def test_time_moves_by_numbers_of_seconds(token_clock: StoreClock, seconds: Any) -> None:
    with pytest.raises(TypeError, match="number of seconds"):
        token_clock.advance(seconds)
    assert token_clock.offset_seconds == 0


def test_time_moves_at_most_a_century_ahead(token_client: TokenClient, token_clock: StoreClock) -> None:
    token = token_client.generate(SCOPE).token
    with pytest.raises(ValueError, match="more than a century"):
        token_clock.advance(1e18)
    token_clock.advance(99 * 365 * 86400)  # far, but what Redis can count: the store still answers
    with pytest.raises(TokenInvalid):
        token_client.consume(token, SCOPE)
    assert token_client.consume(token_client.generate(SCOPE).token, SCOPE)


def test_a_holder_crashes_once(token_client: TokenClient, token_faults: Any, token_clock: StoreClock) -> None:
    token = token_client.generate(SCOPE).token
    holder = token_faults.in_flight(token, SCOPE, lease_seconds=10)
    holder.crash()
    moved = token_clock.offset_seconds
    holder.crash()
    assert token_clock.offset_seconds == moved


def test_a_zero_advance_changes_nothing(token_client: TokenClient, token_clock: StoreClock) -> None:
    token = token_client.generate(SCOPE, ttl_seconds=3600).token
    token_clock.advance(0)
    assert token_clock.offset_seconds == 0
    assert token_client.verify(token).state == "ISSUED"


def test_an_async_client_refuses_a_second_event_loop(token_store: InMemoryStore) -> None:
    client = token_store.async_client()

    async def generate() -> str:
        return (await client.generate(SCOPE)).token

    asyncio.run(generate())
    with pytest.raises(RuntimeError, match="serves the event loop that first used it"):
        asyncio.run(generate())


def test_a_client_kept_past_its_test_is_refused_in_the_next_one(
    token_store: InMemoryStore, request: pytest.FixtureRequest
) -> None:
    # a client a test kept (a module global, a thread still running) must not reach the next
    # test's tokens, nor report that test's tokens as gone; reset() is what the fixture does
    # between two tests, done here inside one so that no test depends on another's order
    kept = token_store.client()
    token_store.reset("the next test")
    with pytest.raises(StoreClosed, match=request.node.name):
        kept.generate(SCOPE)
    fresh = token_store.client()
    token = fresh.generate(SCOPE).token
    with pytest.raises(StoreClosed):
        kept.consume(token, SCOPE)
    fresh.consume(token, SCOPE)


def test_a_token_of_another_store_is_unknown(token_client: TokenClient) -> None:
    other = InMemoryStore()
    token = other.client().generate(SCOPE).token
    with pytest.raises(TokenInvalid):
        token_client.consume(token, SCOPE)


def _run_without(module: str, code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter where importing ``module`` fails, as where it is not installed."""
    blocker = textwrap.dedent(
        f"""
        import sys
        class Missing:
            def find_spec(self, name, path=None, target=None):
                if name == {module!r} or name.startswith({module!r} + "."):
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None
        sys.meta_path.insert(0, Missing())
        """
    )
    return subprocess.run(
        [sys.executable, "-c", blocker + code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )


def test_the_plugin_without_pytest_says_to_install_it() -> None:
    done = _run_without("pytest", "import token_service.testing.plugin")
    assert done.returncode != 0
    assert "a pytest plugin, needs 'pytest', which is not installed: pip install pytest" in done.stderr


def test_the_kit_without_pytest_imports_and_runs() -> None:
    code = (
        "from token_service.testing import InMemoryStore\n"
        "client = InMemoryStore().client()\n"
        "token = client.generate('payment.create').token\n"
        "print(client.consume(token, 'payment.create'))\n"
    )
    done = _run_without("pytest", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Consumed(replayed=False)\n"


@pytest.mark.parametrize("missing", ["fakeredis", "lupa"])
def test_the_kit_without_fakeredis_names_the_extra(missing: str) -> None:
    done = _run_without(missing, "from token_service.testing import InMemoryStore")
    assert done.returncode != 0
    assert "pip install 'idempotency-token-service[client]'" in done.stderr, done.stderr
    assert f"needs {missing!r}, which is not installed" in done.stderr


def test_the_plugin_loads_where_the_kit_cannot_and_its_fixtures_say_why(tmp_path: Any) -> None:
    # the entry point is registered by any install of the wheel, extras or not: a suite that does
    # not use the kit must still run where fakeredis is absent, and one that does is told why not
    (tmp_path / "test_users.py").write_text(
        "def test_plain():\n    assert True\n\ndef test_kit(token_client):\n    pass\n"
    )
    code = f"import sys, pytest\nsys.exit(pytest.main(['-p', 'no:cacheprovider', '-q', {str(tmp_path)!r}]))\n"
    done = _run_without("fakeredis", code)
    assert "1 passed, 1 error" in done.stdout, done.stdout[-3000:]
    assert "pip install 'idempotency-token-service[client]'" in done.stdout


def test_the_plugin_is_the_pytest11_entry_point_named_token_service() -> None:
    from importlib.metadata import entry_points

    [plugin] = [point for point in entry_points(group="pytest11") if point.name == "token_service"]
    assert plugin.value == "token_service.testing.plugin"


def test_the_plugin_alone_imports_neither_the_sdk_nor_fakeredis() -> None:
    # it loads in every pytest run where the wheel is installed: a suite that never asks for a
    # fixture of the kit pays for nothing of it
    code = (
        "import sys, token_service.testing.plugin\n"
        "kit = ('token_service.client', 'fakeredis', 'lupa')\n"
        "print(sorted(m for m in sys.modules if m.startswith(kit)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n"
