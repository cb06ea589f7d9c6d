"""What the SDK tests share: the ``Sdk`` a fixture of tests/client/conftest.py yields, and the in-process app.

The ``sdk`` and ``async_sdk`` fixtures (tests/client/conftest.py) build these;
tests import the names from here, never from a conftest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.support.service import API_KEY
from token_service import create_app


@dataclass
class Sdk:
    kind: str
    client: Any  # TokenClient | AsyncTokenClient
    redis: Any  # a sync redis client on the same data

    @property
    def http(self) -> bool:
        return self.kind.startswith("http")


def inproc_app(redis_client: Any, **config: Any) -> Any:
    """The service in-process on this Redis, keyed with the tests' API_KEY, rate limit off."""
    return create_app({"api_keys": API_KEY, "redis_client": redis_client, "rate_limit": "off", **config})
