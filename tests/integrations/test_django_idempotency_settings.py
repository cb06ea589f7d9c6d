"""Django's Idempotency-Key middleware reads its options from ``TOKEN_SERVICE["IDEMPOTENCY_KEY"]``:
every ``IdempotencyOptions`` field by its upper-case name, and a name that is none of them (a
misspelt ``TTL_SECOND``) refused at start-up instead of silently leaving the default in place.
No Redis is reached: the middleware only makes its clients."""

from __future__ import annotations

from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import override_settings

from tests.integrations.test_require_token_parity import configure_django
from token_service.client.django import IdempotencyKeyMiddleware


def view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(b"ok")


def middleware(**options: Any) -> IdempotencyKeyMiddleware:
    configure_django()
    service = {"REDIS_URL": "redis://127.0.0.1:1/0", "IDEMPOTENCY_KEY": options}
    with override_settings(TOKEN_SERVICE=service):
        return IdempotencyKeyMiddleware(view)


def test_every_option_is_a_setting_by_its_upper_case_name() -> None:
    made = middleware(TTL_SECONDS=60, METHODS=["put"], TELEMETRY_SCOPE="orders", PATHS=["/api/"])
    options = made.core.options
    assert (options.ttl_seconds, options.methods, options.telemetry_scope) == (60, {"PUT"}, "orders")
    assert made.paths == ("/api/",)


def test_a_misspelt_setting_is_refused() -> None:
    with pytest.raises(TypeError, match=r"TTL_SECOND .*TTL_SECONDS"):
        middleware(TTL_SECOND=60)
