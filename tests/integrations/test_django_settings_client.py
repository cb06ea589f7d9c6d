"""The client ``@require_token`` uses when given none: the one ``settings.TOKEN_SERVICE`` describes.

``REDIS_URL`` (and ``KEY_PREFIX``) makes a client straight to Redis, ``URL`` and ``API_KEY`` one
over HTTP, anything else is refused with a TypeError naming both; the same for the sync client
(one per process) and the async one (one per event loop). No Redis is reached: only the clients
are made."""

from __future__ import annotations

import weakref
from typing import Any

import pytest
from django.test import override_settings

from tests.integrations.test_require_token_parity import configure_django
from token_service.client import AsyncTokenClient, TokenClient
from token_service.client import django as django_sdk
from token_service.client._direct import AsyncDirectTransport, DirectTransport
from token_service.client._http import AsyncHttpTransport, HttpTransport

DIRECT = {"REDIS_URL": "redis://127.0.0.1:1/0", "KEY_PREFIX": "shop:"}
OVER_HTTP = {"URL": "http://127.0.0.1:1", "API_KEY": "a-key"}


@pytest.fixture(autouse=True)
def no_client_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    configure_django()
    monkeypatch.setattr(django_sdk, "_sync_client", None)
    monkeypatch.setattr(django_sdk, "_async_clients", weakref.WeakKeyDictionary())


def test_the_sync_client_of_each_setting() -> None:
    with override_settings(TOKEN_SERVICE=DIRECT):
        direct = django_sdk.token_client()
        assert django_sdk.token_client() is direct  # one per process
    assert isinstance(direct, TokenClient)
    assert isinstance(direct._backend, DirectTransport)
    assert direct._backend.store.key_prefix == "shop:"
    direct.close()

    django_sdk._sync_client = None  # put back by the fixture
    with override_settings(TOKEN_SERVICE=OVER_HTTP):
        over_http = django_sdk.token_client()
    assert isinstance(over_http._backend, HttpTransport)
    over_http.close()


async def test_the_async_client_of_each_setting() -> None:
    with override_settings(TOKEN_SERVICE=DIRECT):
        direct = django_sdk.async_token_client()
        assert django_sdk.async_token_client() is direct  # one per event loop
    assert isinstance(direct, AsyncTokenClient)
    assert isinstance(direct._backend, AsyncDirectTransport)
    assert direct._backend.store.key_prefix == "shop:"
    await direct.close()

    django_sdk._async_clients.clear()
    with override_settings(TOKEN_SERVICE=OVER_HTTP):
        over_http = django_sdk.async_token_client()
    assert isinstance(over_http._backend, AsyncHttpTransport)
    await over_http.close()


@pytest.mark.parametrize("setting", [{}, {"API_KEY": "a-key"}, {"KEY_PREFIX": "shop:"}])
async def test_a_setting_with_neither_redis_url_nor_url_is_refused(setting: dict[str, Any]) -> None:
    with override_settings(TOKEN_SERVICE=setting):
        with pytest.raises(TypeError, match="needs REDIS_URL, or URL and API_KEY"):
            django_sdk.token_client()
        with pytest.raises(TypeError, match="needs REDIS_URL, or URL and API_KEY"):
            django_sdk.async_token_client()
