"""docker-compose.yml, checked without a Docker engine: the compose-spec schema, then what it
must agree with.

The schema is the compose-spec JSON schema that check-jsonschema ships
(``--builtin-schema vendor.compose-spec``; offline). Then: every service's image is pinned or
its build context holds a Dockerfile, nginx mounts the very file tests/edge/test_nginx.py runs
and logs where the nginx image sends to stdout, the file's upstream is the compose service on the
image's port, the service's TOKEN_SERVICE_* variables are settings with values the service
accepts, and the stop grace period covers the drain and gunicorn's graceful timeout.

As in test_kubernetes.py, each check returns its problems and is also run on a copy broken
one way at a time.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.dockerfile import graceful_timeout_seconds, runtime_image
from tests.support.processes import REPO_ROOT
from token_service import config

COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
NGINX_CONF = REPO_ROOT / "deploy" / "nginx" / "token-service.conf"
# the nginx image links this path to /dev/stdout (and error.log to /dev/stderr)
NGINX_STDOUT_LOG = "/var/log/nginx/access.log"
SERVICE = "token-service"

Compose = dict[str, Any]


@functools.cache
def _parsed() -> Compose:
    parsed: Compose = yaml.safe_load(COMPOSE_FILE.read_text())
    return parsed


def load_compose() -> Compose:
    """A fresh copy each time: the breakage tests change theirs."""
    return copy.deepcopy(_parsed())


def interpolated(value: str) -> str:
    """Compose's ${NAME:-default} and ${NAME-default} as they come out with NAME unset."""
    return re.sub(r"\$\{\w+:?-([^}]*)\}", r"\1", value)


def duration_seconds(value: str | int) -> float:
    """A compose duration: 20s, 1m30s, 1500ms (a bare number is seconds)."""
    if isinstance(value, int):
        return float(value)
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", value)
    assert "".join(number + unit for number, unit in parts) == value, f"not a duration: {value!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


def service_env(compose: Compose) -> dict[str, str]:
    environment = compose["services"][SERVICE].get("environment", {})
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    return {name: interpolated(str(value)) for name, value in environment.items()}


# --- the checks -----------------------------------------------------------------------------------


def schema_problems(compose: Compose, tmp_path: Path) -> list[str]:
    document = tmp_path / "compose.json"
    document.write_text(json.dumps(compose))
    result = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(document)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return [] if result.returncode == 0 else [result.stdout + result.stderr]


def image_problems(compose: Compose) -> list[str]:
    problems = []
    for name, service in compose["services"].items():
        if "build" in service:
            build = service["build"]
            context = REPO_ROOT / (build if isinstance(build, str) else build.get("context", "."))
            dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
            if not (context / dockerfile).is_file():
                problems.append(f"{name}: no {dockerfile} in the build context {context}")
        elif "image" in service:
            reference = str(service["image"])
            tag = reference.rpartition(":")[2] if ":" in reference.rpartition("/")[2] else ""
            if not tag or tag == "latest":
                problems.append(f"{name}: image {reference} is not pinned to a version")
        else:
            problems.append(f"{name}: neither build nor image")
    return problems


def nginx_problems(compose: Compose, conf: str | None = None) -> list[str]:
    """``conf``: the server block's text, the shipped file's unless given."""
    problems = []
    proxy = compose["services"].get("nginx", {})
    if not str(proxy.get("image", "")).startswith("nginx:"):
        problems.append("the proxy is not the nginx image (whose access.log is its stdout)")
    mounts = [str(volume).split(":") for volume in proxy.get("volumes", [])]
    conf_mounts = [parts for parts in mounts if parts[1:2] == ["/etc/nginx/conf.d/default.conf"]]
    if len(conf_mounts) != 1 or (REPO_ROOT / conf_mounts[0][0]).resolve() != NGINX_CONF:
        problems.append(f"nginx does not mount {NGINX_CONF.relative_to(REPO_ROOT)} as its server block")
    # tests/edge/test_nginx.py runs it through tests/support/nginx.py's runner
    runner = (REPO_ROOT / "tests/support/nginx.py").read_text()
    if (
        '"deploy" / "nginx" / "token-service.conf"' not in runner
        or "tests.support.nginx import" not in (REPO_ROOT / "tests/edge/test_nginx.py").read_text()
    ):
        problems.append("tests/edge/test_nginx.py no longer runs deploy/nginx/token-service.conf")
    # logs: the compose logs show only stdout and stderr
    conf = NGINX_CONF.read_text() if conf is None else conf
    logs = re.findall(r"^\s*(access_log|error_log)\s+(\S+)", conf, re.MULTILINE)
    for directive, target in logs:
        if target not in (NGINX_STDOUT_LOG, "/dev/stdout", "/dev/stderr", "stderr", "off"):
            problems.append(f"{directive} {target}: a file inside the container, not stdout/stderr")
    if ("access_log", NGINX_STDOUT_LOG) not in logs and ("access_log", "/dev/stdout") not in logs:
        problems.append("nginx writes no access line to stdout")
    # the unauthenticated /metrics stays inside (openapi.yaml); tests/edge/test_nginx.py runs it
    if not re.search(r"location = /metrics \{\s*return 404;", conf):
        problems.append("nginx routes /metrics: it is not authenticated")
    # the upstream is the compose service, on the port the image listens on
    upstream = re.search(r"^\s*server\s+([\w.-]+):(\d+);", conf, re.MULTILINE)
    exposed = [str(port) for port in compose["services"][SERVICE].get("expose", [])]
    port = str(runtime_image().port)
    if not upstream or upstream.group(1) not in compose["services"] or upstream.group(2) != port:
        problems.append(f"the nginx upstream {upstream and upstream.group(0)!r} is not {SERVICE}:{port}")
    if exposed != [port]:
        problems.append(f"{SERVICE} exposes {exposed}, the image listens on {port}")
    if "ports" in compose["services"][SERVICE]:
        problems.append(f"{SERVICE} is published: only nginx should reach it")
    return problems


def environment_problems(compose: Compose) -> list[str]:
    env = service_env(compose)
    problems = list(config.unknown_variables(env))
    try:
        settings = config.Settings.from_env(
            {name: value for name, value in env.items() if name in config.variable_names()}
        )
    except config.ConfigError as exc:
        return [*problems, str(exc)]
    host = settings.redis_target.url.split("://", 1)[1].split("/", 1)[0].rpartition("@")[2].split(":")[0]
    if host not in compose["services"]:
        problems.append(f"TOKEN_SERVICE_REDIS_URL points at {host!r}, not a compose service")
    if settings.trusted_proxy_hops != 1:
        problems.append("TOKEN_SERVICE_TRUSTED_PROXY_HOPS must be 1: nginx is the one proxy in front")
    if not settings.api_keys:
        problems.append("no TOKEN_SERVICE_API_KEYS: the backend routes would answer no one")
    return problems


def stop_problems(compose: Compose) -> list[str]:
    service = compose["services"][SERVICE]
    env = {**runtime_image().env, **service_env(compose)}
    drain = "TOKEN_SERVICE_DRAIN_SECONDS"
    drain_seconds = config.Settings.from_env({drain: env[drain]} if drain in env else {}).drain_seconds
    # compose's default is 10 s: less than drain + graceful, so it must be set
    grace = duration_seconds(service.get("stop_grace_period", "10s"))
    needed = drain_seconds + graceful_timeout_seconds()
    if grace <= needed:
        return [f"stop_grace_period {grace:g} s does not exceed drain {drain_seconds} s + graceful timeout"]
    if service.get("stop_signal", "SIGTERM") != "SIGTERM":
        return ["the service drains on SIGTERM only"]
    return []


SEMANTIC_CHECKS: list[Callable[[Compose], list[str]]] = [
    image_problems,
    nginx_problems,
    environment_problems,
    stop_problems,
]


def test_the_compose_file_is_valid_compose(tmp_path: Path) -> None:
    assert schema_problems(load_compose(), tmp_path) == []


@pytest.mark.parametrize("check", SEMANTIC_CHECKS, ids=lambda check: check.__name__)
def test_the_compose_file_agrees_with_the_image_nginx_and_the_settings(
    check: Callable[[Compose], list[str]],
) -> None:
    assert check(load_compose()) == []


def token_service(compose: Compose) -> dict[str, Any]:
    found: dict[str, Any] = compose["services"][SERVICE]
    return found


BREAKAGES: dict[str, tuple[Callable[[Compose], None], str]] = {
    "misspelt key": (lambda c: token_service(c).update(stop_grace_periode="20s"), "stop_grace_periode"),
    "misspelt setting": (
        lambda c: token_service(c)["environment"].update(TOKEN_SERVICE_TRUSTED_PROXY_HOP="1"),
        "TOKEN_SERVICE_TRUSTED_PROXY_HOP: not a setting",
    ),
    "bad setting value": (
        lambda c: token_service(c)["environment"].update(TOKEN_SERVICE_API_KEYS="short"),
        "TOKEN_SERVICE_API_KEYS",
    ),
    "short stop grace period": (
        lambda c: token_service(c).update(stop_grace_period="10s"),
        "does not exceed",
    ),
    "longer drain": (
        lambda c: token_service(c)["environment"].update(TOKEN_SERVICE_DRAIN_SECONDS="15"),
        "does not exceed",
    ),
    "another nginx file": (
        lambda c: c["services"]["nginx"].update(volumes=["./nginx.conf:/etc/nginx/conf.d/default.conf:ro"]),
        "does not mount",
    ),
    "missing build context": (lambda c: token_service(c).update(build="./service"), "no Dockerfile"),
    "unpinned image": (lambda c: c["services"]["redis"].update(image="redis"), "not pinned"),
    "service published": (lambda c: token_service(c).update(ports=["8000:8000"]), "published"),
    "redis elsewhere": (
        lambda c: token_service(c)["environment"].update(TOKEN_SERVICE_REDIS_URL="redis://cache:6379/0"),
        "'cache', not a compose service",
    ),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_a_broken_compose_file_is_caught(breakage: str, tmp_path: Path) -> None:
    compose = load_compose()
    mutate, expected = BREAKAGES[breakage]
    mutate(compose)
    problems = schema_problems(compose, tmp_path) if breakage == "misspelt key" else []
    for check in SEMANTIC_CHECKS:
        problems += check(compose)
    assert any(expected in problem for problem in problems), problems


def test_an_access_log_in_a_file_is_caught() -> None:
    """The file as it was: its access lines went to a file inside the container."""
    before = NGINX_CONF.read_text().replace(
        f"access_log {NGINX_STDOUT_LOG} ", "access_log /var/log/nginx/token-service.access.log "
    )
    problems = nginx_problems(load_compose(), before)
    assert any("a file inside the container" in problem for problem in problems), problems


def test_metrics_routed_by_nginx_are_caught() -> None:
    routed = re.sub(r"location = /metrics \{\s*return 404;\s*\}", "", NGINX_CONF.read_text())
    problems = nginx_problems(load_compose(), routed)
    assert any("routes /metrics" in problem for problem in problems), problems
