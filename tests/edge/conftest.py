"""Fixtures for the edge tests: apps with limits, CORS or a subject header configured."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.support.service import API_KEY
from token_service import create_app


@pytest.fixture
def make_client(redis_client: Any) -> Callable[..., Any]:
    """A Flask test client on the parametrized Redis, with these settings over the defaults."""

    def make(**settings: Any) -> Any:
        config = {"api_keys": API_KEY, "redis_client": redis_client, **settings}
        return create_app(config).test_client()

    return make
