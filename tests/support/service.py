"""What the tests' services share: the test service key, its header, and their settings.

Import these from here (``from tests.support.service import API_KEY``), never
from a conftest: a conftest is for fixtures, and importing one as a module
loads it a second time under another name.
"""

from __future__ import annotations

from typing import Any

from token_service.client import RetryPolicy

API_KEY = "test-service-key-0123456789"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
# Retries on, but quick: the tests that exercise them count attempts, not seconds.
FAST_RETRY = RetryPolicy(attempts=3, backoff_seconds=0.01, max_backoff_seconds=0.05)
# The settings that turn the anonymous budget and the memory reserve off (their tests turn them on)
NO_BUDGET = {
    "anonymous_max_outstanding": "0",
    "anonymous_max_outstanding_bytes": "0",
    "anonymous_max_memory_percent": "0",
}


def service_env(redis_url: str, **extra: str) -> dict[str, str]:
    """Environment of a service process (gunicorn, the CLI) on that Redis, with the test key."""
    return {
        "TOKEN_SERVICE_REDIS_URL": redis_url,
        "TOKEN_SERVICE_API_KEYS": API_KEY,
        "TOKEN_SERVICE_RATE_LIMIT": "off",
        **extra,
    }


def service_config(redis_url: str, **overrides: Any) -> dict[str, Any]:
    """create_app settings as an operator would write them: a URL picks the topology."""
    # no issuance limits: these tests issue thousands of tokens from one address
    return {
        "redis_url": redis_url,
        "api_keys": API_KEY,
        "rate_limit": "off",
        "max_outstanding_per_subject": 0,
        **overrides,
    }
