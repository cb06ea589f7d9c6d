"""Configuration that cannot be gotten wrong quietly (docs/configuration.md).

Unknown TOKEN_SERVICE_* variables are named (with the closest valid name) by
``serve`` and ``check``, every message carries full variable names, ``check``
prints values as the docs write them, non-ASCII service keys are refused, and
a real Redis without service keys warns loudly, and the development key is refused on a real
Redis unless TOKEN_SERVICE_ENVIRONMENT=development says so (then the service warns loudly).
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.support.processes import REPO_ROOT, RedisServer, free_port
from tests.test_cli import run_cli
from token_service import create_app
from token_service.config import ConfigError, RateLimit, Settings, unknown_variables, variable_names


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("TOKEN_SERVICE_RATELIMIT", "TOKEN_SERVICE_RATE_LIMIT"),
        ("TOKEN_SERVICE_API_KEY", "TOKEN_SERVICE_API_KEYS"),
        ("TOKEN_SERVICE_MAX_TTL", "TOKEN_SERVICE_MAX_TTL_SECONDS"),
        ("token_service_redis_url", "TOKEN_SERVICE_REDIS_URL"),
    ],
)
def test_a_misspelled_variable_stops_serve_and_check_naming_the_closest_valid_name(
    typo: str, meant: str
) -> None:
    for command in ("check", "serve"):
        result = run_cli(command, env={typo: "5/second"})
        assert result.returncode == 2, result.stdout
        assert f"{typo}: not a setting of token-service (did you mean {meant}?)" in result.stderr
        assert "Traceback" not in result.stderr


def test_a_variable_like_no_other_is_still_named() -> None:
    assert unknown_variables({"TOKEN_SERVICE_ZZZZZZZZZZ": "1", "PATH": "/bin"}) == [
        "TOKEN_SERVICE_ZZZZZZZZZZ: not a setting of token-service"
    ]
    assert unknown_variables({name: "" for name in variable_names()}) == []


def test_an_app_started_by_gunicorn_directly_logs_unknown_variables(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TOKEN_SERVICE_RATELIMIT", "5/second")
    monkeypatch.delenv("TOKEN_SERVICE_REDIS_URL", raising=False)
    with caplog.at_level(logging.WARNING):
        create_app()
    assert (
        "TOKEN_SERVICE_RATELIMIT: not a setting of token-service (did you mean TOKEN_SERVICE_RATE_LIMIT?)"
        in (caplog.text)
    )


def test_every_message_names_variables_in_full() -> None:
    with pytest.raises(ConfigError) as error:
        Settings.from_env(
            {"TOKEN_SERVICE_DEFAULT_TTL_SECONDS": "600", "TOKEN_SERVICE_MAX_TTL_SECONDS": "300"}
        )
    assert str(error.value) == (
        "TOKEN_SERVICE_DEFAULT_TTL_SECONDS: must not exceed TOKEN_SERVICE_MAX_TTL_SECONDS (300)"
    )
    with pytest.raises(ConfigError) as error:
        Settings.from_env(
            {"TOKEN_SERVICE_DEFAULT_LEASE_SECONDS": "60", "TOKEN_SERVICE_MAX_LEASE_SECONDS": "30"}
        )
    assert "must not exceed TOKEN_SERVICE_MAX_LEASE_SECONDS (30)" in str(error.value)


def test_check_prints_values_as_the_docs_write_them() -> None:
    defaults = run_cli("check")
    assert defaults.returncode == 0, defaults.stderr
    assert "TOKEN_SERVICE_RATE_LIMIT=60/minute" in defaults.stdout
    assert "60/60s" not in defaults.stdout
    for written in ("5/second", "100/hour", "1000/day", "off"):
        shown = run_cli("check", env={"TOKEN_SERVICE_RATE_LIMIT": written})
        assert f"TOKEN_SERVICE_RATE_LIMIT={written}\n" in shown.stdout
    assert str(RateLimit(60, 60)) == "60/minute"


@pytest.mark.parametrize(
    "key", ["clé-de-service-0123456789", "service-key-0123456789-\u00e9", "key\twith-a-tab-01234"]
)
def test_a_service_key_that_could_never_authenticate_is_refused(key: str) -> None:
    with pytest.raises(ConfigError, match="TOKEN_SERVICE_API_KEYS: each key must be printable ASCII"):
        Settings.from_env({"TOKEN_SERVICE_API_KEYS": f"good-service-key-0123456789,{key}"})
    result = run_cli("check", env={"TOKEN_SERVICE_API_KEYS": key})
    assert result.returncode == 2
    assert "printable ASCII" in result.stderr
    assert key not in result.stderr  # a secret is never echoed


def test_no_service_keys_on_a_real_redis_warns_loudly(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    result = run_cli("check", env={"TOKEN_SERVICE_REDIS_URL": redis_server.url})
    assert result.returncode == 0, result.stderr
    assert "WARNING: TOKEN_SERVICE_API_KEYS is empty" in result.stderr
    with caplog.at_level(logging.WARNING):
        app: Any = create_app({"redis_url": redis_server.url})
    assert "TOKEN_SERVICE_API_KEYS is empty" in caplog.text
    reply = app.test_client().post("/token/consume", json={"token": "x" * 43, "scope": "s"})
    assert reply.status_code == 401
    # the embedded store (trying it out) needs no keys and says nothing about them
    quiet = run_cli("check")
    assert "TOKEN_SERVICE_API_KEYS is empty" not in quiet.stderr


DEV_KEY = "dev-service-key-change-me"  # make run's and docker-compose.yml's


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TOKEN_SERVICE_API_KEYS", DEV_KEY),
        ("TOKEN_SERVICE_API_KEYS", f"a-key-of-our-own-0123,{DEV_KEY}"),
        ("TOKEN_SERVICE_API_KEYS", "sha256:" + hashlib.sha256(DEV_KEY.encode()).hexdigest().upper()),
        ("TOKEN_SERVICE_ADMIN_KEYS", DEV_KEY),
    ],
)
def test_the_development_key_on_a_real_redis_is_refused(
    redis_server: RedisServer, variable: str, value: str
) -> None:
    env = {"TOKEN_SERVICE_REDIS_URL": redis_server.url, variable: value}
    for command in ("check", "serve"):
        result = run_cli(
            *([command] if command == "check" else [command, "--port", str(free_port())]), env=env
        )
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        [line] = result.stderr.strip().splitlines()
        assert line.startswith(
            f"token-service: configuration error: {variable}: {DEV_KEY} is the development"
        )
        assert "TOKEN_SERVICE_ENVIRONMENT=development" in line
    with pytest.raises(ConfigError, match=f"{variable}: {DEV_KEY} is the development key"):
        create_app({"redis_url": redis_server.url, variable.removeprefix("TOKEN_SERVICE_").lower(): value})
    # what gunicorn reads first when started by hand (the image's CMD) stops the same way
    gunicorn_conf = subprocess.run(
        [sys.executable, "-c", "import token_service.server.gunicorn_conf"],
        env={**run_env(), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert gunicorn_conf.returncode == 2
    assert f"{variable}: {DEV_KEY} is the development key" in gunicorn_conf.stderr


def test_the_development_key_works_on_the_embedded_store_as_make_run_needs() -> None:
    result = run_cli("check", env={"TOKEN_SERVICE_API_KEYS": DEV_KEY})
    assert result.returncode == 0, result.stderr
    assert "embedded" in result.stdout
    assert "development" not in result.stderr  # nothing to warn about: nothing is kept
    consumed = (
        create_app({"api_keys": DEV_KEY})
        .test_client()
        .post(
            "/token/consume",
            json={"token": "x" * 43, "scope": "s"},
            headers={"Authorization": f"Bearer {DEV_KEY}"},
        )
    )
    assert consumed.status_code == 404  # authenticated: the token is unknown


def test_the_development_setting_lets_it_run_on_a_real_redis_and_says_so_loudly(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    env = {
        "TOKEN_SERVICE_REDIS_URL": redis_server.url,
        "TOKEN_SERVICE_API_KEYS": DEV_KEY,
        "TOKEN_SERVICE_ENVIRONMENT": "development",
    }
    result = run_cli("check", env=env)
    assert result.returncode == 0, result.stderr
    assert "TOKEN_SERVICE_ENVIRONMENT=development" in result.stdout
    assert "token-service: WARNING: TOKEN_SERVICE_ENVIRONMENT=development on a real Redis" in result.stderr
    with caplog.at_level(logging.WARNING):
        app: Any = create_app(
            {"redis_url": redis_server.url, "api_keys": DEV_KEY, "environment": "development"}
        )
    [warning] = [r for r in caplog.records if "TOKEN_SERVICE_ENVIRONMENT=development" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert "Never run this in production" in warning.getMessage()
    consumed = app.test_client().post(
        "/token/consume",
        json={"token": "x" * 43, "scope": "s"},
        headers={"Authorization": f"Bearer {DEV_KEY}"},
    )
    assert consumed.status_code == 404
    # production, the default, says nothing of it; a value that is neither is refused
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        create_app({"redis_url": redis_server.url, "api_keys": "a-key-of-our-own-0123"})
    assert "TOKEN_SERVICE_ENVIRONMENT" not in caplog.text
    with pytest.raises(
        ConfigError, match="TOKEN_SERVICE_ENVIRONMENT: must be one of production, development"
    ):
        Settings.from_env({"TOKEN_SERVICE_ENVIRONMENT": "dev"})


def run_env() -> dict[str, str]:
    """This environment without the project's settings (as run_cli has it), the checkout importable."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOKEN_SERVICE_")}
    return {**clean, "PYTHONPATH": str(REPO_ROOT)}
