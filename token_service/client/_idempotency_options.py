"""The options of an ``Idempotency-Key`` middleware, one value (Powertools' ``IdempotencyConfig``):
the WSGI and ASGI middlewares take them by name (or ``options=``), the Django one from
``TOKEN_SERVICE["IDEMPOTENCY_KEY"]`` (upper case); the defaults and the checks are here, once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, TypedDict

from token_service.client._fingerprint import FingerprintSpec
from token_service.client._stored_response import StorePolicy, default_store_status
from token_service.client._telemetry import Telemetry

__all__ = ["IdempotencyOptionArgs", "IdempotencyOptions", "options_from_settings", "options_of"]

# A key's record lives a day, a claim's lock a minute.
DEFAULT_TTL_SECONDS = 86400
DEFAULT_LOCK_SECONDS = 60
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_MAX_STORED_BYTES = 256 * 1024
# A 4xx is answered to anyone who sends a key with any Authorization header, before the app has
# verified it: its kept body is what one stranger can make Redis hold per request. A problem+json
# refusal is well under 1 KiB; an app's 400/422 that echoes its input (FastAPI's does) is as large
# as the request, and is stored as omitted above this.
DEFAULT_MAX_STORED_4XX_BYTES = 4 * 1024


@dataclass(frozen=True, slots=True)
class IdempotencyOptions:
    """What an Idempotency-Key middleware does (docs/integrations/wsgi-middleware.md, Options).

    ``methods`` is kept upper case, as a frozenset; ``telemetry`` None is the SDK's default.
    ``ttl_seconds`` and ``lock_seconds`` are positive whole seconds, ``wait_seconds`` >= 0;
    ``max_stored_4xx_bytes`` caps a 4xx body kept (at most ``max_stored_bytes`` too).
    """

    header: str = "Idempotency-Key"
    methods: Iterable[str] = ("POST", "PATCH")
    required: bool = True
    ttl_seconds: int = DEFAULT_TTL_SECONDS
    lock_seconds: int = DEFAULT_LOCK_SECONDS
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_stored_bytes: int = DEFAULT_MAX_STORED_BYTES
    max_stored_4xx_bytes: int = DEFAULT_MAX_STORED_4XX_BYTES
    store_status: StorePolicy = default_store_status
    fingerprint: FingerprintSpec = None
    wait_seconds: float = 0.0
    telemetry: Telemetry | None = None
    telemetry_scope: str = "idempotency_key"

    def __post_init__(self) -> None:
        wait = self.wait_seconds
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not wait >= 0:
            raise ValueError(f"wait_seconds must be a number of seconds >= 0, not {wait!r}")
        _whole("ttl_seconds", self.ttl_seconds, 1, "a positive whole number of seconds")
        _whole("lock_seconds", self.lock_seconds, 1, "a positive whole number of seconds")
        _whole("max_stored_4xx_bytes", self.max_stored_4xx_bytes, 0, "a whole number of bytes >= 0")
        # frozen: the normal forms are set past __setattr__, once
        object.__setattr__(self, "wait_seconds", float(wait))
        object.__setattr__(self, "methods", frozenset(method.upper() for method in self.methods))


_FIELDS = frozenset(option.name for option in fields(IdempotencyOptions))


class IdempotencyOptionArgs(TypedDict, total=False):
    """:class:`IdempotencyOptions` as keyword arguments: what the WSGI and ASGI middlewares take."""

    header: str
    methods: Iterable[str]
    required: bool
    ttl_seconds: int
    lock_seconds: int
    max_body_bytes: int
    max_stored_bytes: int
    max_stored_4xx_bytes: int
    store_status: StorePolicy
    fingerprint: FingerprintSpec
    wait_seconds: float
    telemetry: Telemetry | None
    telemetry_scope: str


def options_of(options: IdempotencyOptions | None, overrides: Mapping[str, Any]) -> IdempotencyOptions:
    """``options`` (or the defaults) with ``overrides`` on top; an unknown name is a TypeError."""
    if options is None:
        return IdempotencyOptions(**overrides)
    return replace(options, **overrides) if overrides else options


def options_from_settings(
    settings: Mapping[str, Any], where: str = "TOKEN_SERVICE['IDEMPOTENCY_KEY']"
) -> IdempotencyOptions:
    """The options named in upper case (Django's ``TTL_SECONDS``, ...); an unknown name is a TypeError
    that lists the known ones (a misspelt setting would otherwise be a default silently kept)."""
    unknown = sorted(name for name in settings if name.lower() not in _FIELDS)
    if unknown:
        known = ", ".join(sorted(name.upper() for name in _FIELDS))
        raise TypeError(f"{where} has no option {', '.join(unknown)} (the options: {known})")
    return IdempotencyOptions(**{name.lower(): value for name, value in settings.items()})


def _whole(name: str, value: int, least: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be {what}, not {value!r}")
