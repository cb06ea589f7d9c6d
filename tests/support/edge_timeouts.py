"""What the proxies and probes in front of the service wait, derived from its settings.

The service's worst case per request is its Redis budget
(``token_service.connection.request_budget_seconds``); a proxy's read timeout
and the readiness probe's timeout are that and 2 s to spare
(docs/configuration.md, "Timeouts"), so the service's own 503 reaches the
client. tests/edge/test_nginx.py and tests/deploy/test_kubernetes.py hold the
recipes to it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from token_service.config import Settings
from token_service.connection import request_budget_seconds

__all__ = ["MARGIN_SECONDS", "edge_timeout_seconds"]

MARGIN_SECONDS = 2
_BUDGET_SETTINGS = ("TOKEN_SERVICE_REDIS_TIMEOUT_SECONDS", "TOKEN_SERVICE_REDIS_URL")


def edge_timeout_seconds(environment: Mapping[str, str]) -> int:
    """Whole seconds a proxy or probe in front waits for a service with ``environment``."""
    settings = Settings.from_env(
        {name: environment[name] for name in _BUDGET_SETTINGS if name in environment}
    )
    return math.ceil(request_budget_seconds(settings) + MARGIN_SECONDS)
