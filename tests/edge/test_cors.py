"""CORS: an explicit origin allowlist on the frontend-facing routes, nothing on the backend ones."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.support.service import AUTH

ALLOWED = "https://shop.example.com"
BACKEND_ROUTES = [
    "/token/consume",
    "/token/begin",
    "/token/complete",
    "/token/fail",
    "/token/inspect",
    "/token/revoke",
]


@pytest.fixture
def client(make_client: Callable[..., Any]) -> Any:
    return make_client(cors_origins=f"{ALLOWED},http://localhost:3000", rate_limit="off")


def preflight(client: Any, path: str, origin: str, headers: str = "Content-Type, Idempotency-Token") -> Any:
    return client.options(
        path,
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": headers,
        },
    )


def cors_headers(response: Any) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.lower().startswith("access-control-")}


@pytest.mark.parametrize("path", ["/token/generate", "/token/generate/batch"])
def test_preflight_from_an_allowed_origin_passes(client: Any, path: str) -> None:
    response = preflight(client, path, ALLOWED)
    assert response.status_code == 200
    assert response.headers["Access-Control-Allow-Origin"] == ALLOWED
    allowed_headers = {h.strip().lower() for h in response.headers["Access-Control-Allow-Headers"].split(",")}
    assert {"content-type", "idempotency-token"} <= allowed_headers
    assert "POST" in response.headers["Access-Control-Allow-Methods"]
    assert response.headers["Access-Control-Max-Age"] == "600"
    assert "Access-Control-Allow-Credentials" not in response.headers
    assert "Origin" in response.headers.get("Vary", "")


@pytest.mark.parametrize("origin", ["https://evil.example", "https://shop.example.com.evil.example", "null"])
def test_preflight_from_another_origin_gets_no_allow_headers(client: Any, origin: str) -> None:
    response = preflight(client, "/token/generate", origin)
    assert cors_headers(response) == {}


def test_the_actual_request_carries_the_origin_and_exposes_retry_after(client: Any) -> None:
    response = client.post("/token/generate", json={"scope": "pay"}, headers={"Origin": ALLOWED})
    assert response.status_code == 201
    assert response.headers["Access-Control-Allow-Origin"] == ALLOWED
    exposed = {h.strip().lower() for h in response.headers["Access-Control-Expose-Headers"].split(",")}
    assert {"retry-after", "x-request-id"} <= exposed


def test_an_error_reply_is_readable_by_the_allowed_page(client: Any) -> None:
    response = client.post("/token/generate", json={"scope": ""}, headers={"Origin": ALLOWED})
    assert response.status_code == 400
    assert response.headers["Access-Control-Allow-Origin"] == ALLOWED


def test_a_request_from_another_origin_is_not_echoed(client: Any) -> None:
    response = client.post(
        "/token/generate", json={"scope": "pay"}, headers={"Origin": "https://evil.example"}
    )
    assert cors_headers(response) == {}


@pytest.mark.parametrize("path", BACKEND_ROUTES)
def test_backend_routes_never_carry_cors_headers(client: Any, path: str) -> None:
    assert cors_headers(preflight(client, path, ALLOWED)) == {}
    response = client.post(path, json={"token": "x" * 43}, headers={"Origin": ALLOWED, **AUTH})
    assert response.status_code < 500
    assert cors_headers(response) == {}


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/openapi.yaml"])
def test_operational_routes_carry_no_cors_headers(client: Any, path: str) -> None:
    assert cors_headers(client.get(path, headers={"Origin": ALLOWED})) == {}


def test_without_configured_origins_nothing_is_cross_origin(make_client: Callable[..., Any]) -> None:
    client = make_client(rate_limit="off")
    assert cors_headers(preflight(client, "/token/generate", ALLOWED)) == {}
    response = client.post("/token/generate", json={"scope": "pay"}, headers={"Origin": ALLOWED})
    assert response.status_code == 201
    assert cors_headers(response) == {}


def test_an_ipv6_origin_is_matched_exactly_not_as_a_pattern(make_client: Callable[..., Any]) -> None:
    client = make_client(cors_origins="http://[::1]:3000", rate_limit="off")
    ok = preflight(client, "/token/generate", "http://[::1]:3000")
    assert ok.headers["Access-Control-Allow-Origin"] == "http://[::1]:3000"
    # read as a regex, "[::1]" would be a character class matching this
    assert cors_headers(preflight(client, "/token/generate", "http://::3000")) == {}
