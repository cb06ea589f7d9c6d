"""deploy/nginx/token-service.conf, run by a real nginx in front of real gunicorn.

The shipped file is used as it is, except for its two addresses (the listen
port and the upstream's), which the test points at free loopback ports;
nginx runs with its own prefix, pid file and temp folders under the test's
temporary directory. The service runs the shipped gunicorn config with
TOKEN_SERVICE_TRUSTED_PROXY_HOPS=1, as docs/deployment.md says to.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.support.edge_timeouts import edge_timeout_seconds
from tests.support.processes import REPO_ROOT, Gunicorn, RedisServer, start_serving, wait_until
from tests.support.raw_http import Reply, connect, exchange, read_reply, request_bytes
from tests.support.service import API_KEY, AUTH

pytestmark = [pytest.mark.real, pytest.mark.slow]

CONF = REPO_ROOT / "deploy" / "nginx" / "token-service.conf"
JSON = {"Content-Type": "application/json"}
SLOW_SOCKETS = 200


def test_the_proxy_waits_for_the_services_worst_case() -> None:
    """proxy_read_timeout is the service's Redis budget per request + 2 s (docs/configuration.md),
    for the settings docker-compose gives the service this file fronts."""
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    environment = {
        name: str(value) for name, value in compose["services"]["token-service"]["environment"].items()
    }
    timeouts = re.findall(r"^\s*proxy_read_timeout\s+(\d+)s;", CONF.read_text(), re.MULTILINE)
    assert timeouts == [str(edge_timeout_seconds(environment))]


def nginx_binary() -> str:
    binary = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if binary:
        return binary
    message = "nginx is not installed: the proxy recipe's test needs it (apt-get install nginx)"
    if os.environ.get("CI"):
        pytest.fail(message + " — CI must run it", pytrace=False)
    pytest.skip(message)


def shipped_server_block(listen_port: int, upstream_port: int, log_dir: Path) -> str:
    """The shipped file with its two addresses (and its access log path) pointed at the test's."""
    text = CONF.read_text()
    for old, new in [
        ("listen 8080;", f"listen 127.0.0.1:{listen_port};"),
        ("server token-service:8000;", f"server 127.0.0.1:{upstream_port};"),
        ("access_log /var/log/nginx/access.log ", f"access_log {log_dir / 'access.log'} "),
    ]:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


class Nginx:
    def __init__(self, root: Path, upstream_port: int) -> None:
        self.root = root
        self.upstream_port = upstream_port
        self.port = 0  # start() picks a free one
        self.process: subprocess.Popen[bytes] | None = None
        for folder in ("logs", "client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (root / folder).mkdir(parents=True, exist_ok=True)
        user = "user root;\n" if os.geteuid() == 0 else ""  # workers must reach the temp folders
        (root / "nginx.conf").write_text(
            f"""{user}worker_processes 1;
daemon off;
pid {root}/nginx.pid;
error_log {root}/logs/error.log info;
events {{ worker_connections 1024; }}
http {{
    client_body_temp_path {root}/client_body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    include {root}/token-service.conf;
}}
"""
        )

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def start(self) -> Nginx:
        binary = nginx_binary()
        args = [
            binary,
            "-p",
            str(self.root),
            "-c",
            str(self.root / "nginx.conf"),
            "-e",
            str(self.root / "logs/error.log"),
        ]

        def launch(port: int) -> subprocess.Popen[bytes]:
            (self.root / "token-service.conf").write_text(
                shipped_server_block(port, self.upstream_port, self.root / "logs")
            )
            test = subprocess.run([*args, "-t"], capture_output=True, text=True, check=False)
            assert test.returncode == 0, test.stderr
            return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def ready(port: int) -> bool:
            return exchange(("127.0.0.1", port), request_bytes("GET", "/healthz"), 1).status == 200

        self.process, self.port = start_serving(launch, ready, "nginx")
        return self

    def access_log(self) -> str:
        return (self.root / "logs" / "access.log").read_text()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=20)


@dataclass
class Stack:
    redis: RedisServer
    service: Gunicorn
    nginx: Nginx


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    redis_server = RedisServer().start()
    service = Gunicorn(
        {
            "TOKEN_SERVICE_REDIS_URL": redis_server.url,
            "TOKEN_SERVICE_API_KEYS": API_KEY,
            "TOKEN_SERVICE_TRUSTED_PROXY_HOPS": "1",
            # per hour, not per minute: a loaded machine may take 20 s over the four requests, and
            # the limit would admit another one
            "TOKEN_SERVICE_RATE_LIMIT": "3/hour",
        },
        workers=2,
    ).start()
    nginx = Nginx(tmp_path_factory.mktemp("nginx"), service.port)
    try:
        nginx.start()
        yield Stack(redis_server, service, nginx)
    finally:
        nginx.stop()
        service.stop()
        redis_server.stop()


def generate(address: tuple[str, int], source: str, headers: dict[str, str] | None = None) -> Reply:
    body = json.dumps({"scope": "nginx.test"}).encode()
    return exchange(
        address, request_bytes("POST", "/token/generate", body, {**JSON, **(headers or {})}), source=source
    )


def test_per_client_limits_see_the_real_client_address(stack: Stack) -> None:
    address = stack.nginx.address
    # 3 per hour per client: the fourth from 127.0.0.2 is refused, even when it claims another address
    assert [generate(address, "127.0.0.2").status for _ in range(3)] == [201, 201, 201]
    forged = generate(address, "127.0.0.2", {"X-Forwarded-For": "203.0.113.9"})
    assert forged.status == 429
    assert forged.json()["code"] == "rate_limited"
    # another client behind the same proxy is not affected
    assert generate(address, "127.0.0.3").status == 201
    # nor can a client pass for another one: nginx appends the address it saw, the service takes that
    assert generate(address, "127.0.0.3", {"X-Forwarded-For": "127.0.0.2"}).status == 201


def test_replies_and_request_ids_pass_through_unchanged(stack: Stack) -> None:
    direct, proxied = ("127.0.0.1", stack.service.port), stack.nginx.address
    cases = [
        request_bytes("GET", "/healthz", headers={"X-Request-ID": "trace-1"}),
        request_bytes(
            "POST",
            "/token/consume",
            b'{"token": "nope", "scope": "s"}',
            {**AUTH, **JSON, "X-Request-ID": "trace-2"},
        ),
        request_bytes("POST", "/token/consume", b'{"token": ', {**AUTH, **JSON, "X-Request-ID": "trace-3"}),
        request_bytes("POST", "/token/consume", b"{}", {**JSON, "X-Request-ID": "trace-4"}),
        request_bytes("GET", "/no/such/route", headers={"X-Request-ID": "trace-5"}),
    ]
    kept = ("content-type", "cache-control", "x-request-id", "retry-after", "www-authenticate")
    for raw in cases:
        a, b = exchange(direct, raw), exchange(proxied, raw)
        assert (a.status, a.body) == (b.status, b.body)
        assert {k: a.headers.get(k) for k in kept} == {k: b.headers.get(k) for k in kept}
    # no id from the client: nginx makes one, the service answers with it and both log it
    reply = exchange(proxied, request_bytes("GET", "/healthz"))
    request_id = reply.headers["x-request-id"]
    assert len(request_id) == 32
    wait_until(lambda: f"rid={request_id}" in stack.nginx.access_log(), 30, what="nginx's access line")
    wait_until(
        lambda: f'"request_id": "{request_id}"' in stack.service.log(), 30, what="the service's access line"
    )


def upstream_connections(port: int) -> int:
    """Established TCP connections to the service's port (from /proc/net/tcp)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].split(":")[1], 16)
        if local_port == port and fields[3] == "01":
            count += 1
    return count


def test_slow_sockets_at_nginx_do_not_reach_the_workers(stack: Stack) -> None:
    address = stack.nginx.address
    half_body = request_bytes("POST", "/token/generate", b'{"scope": "slow.one"}', JSON)[:-8]
    kinds = [b"", b"POST /token/generate HTTP/1.1\r\nHost: x\r\n", half_body, half_body[:-40]]
    sockets = []
    try:
        for i in range(SLOW_SOCKETS):
            sock = connect(address, "127.0.0.4")
            sock.sendall(kinds[i % len(kinds)]) if kinds[i % len(kinds)] else None
            sockets.append(sock)
        time.sleep(1)  # let nginx take them all in
        # nginx holds them; gunicorn sees at most its few kept-alive upstream connections
        assert upstream_connections(stack.service.port) < 32
        started = time.monotonic()
        statuses = [generate(address, f"127.0.2.{i + 1}").status for i in range(20)]
        assert statuses == [201] * 20
        assert time.monotonic() - started < 60
        assert upstream_connections(stack.service.port) < 32
    finally:
        for sock in sockets:
            sock.close()
    # nothing of theirs reached the service: no request for the scope of the half-sent bodies
    assert "slow.one" not in stack.service.log()


def test_nginx_refuses_a_body_over_the_limit_as_problem_json(stack: Stack) -> None:
    body = b'{"scope": "x", "pad": "' + b"a" * 70_000 + b'"}'
    raw = request_bytes("POST", "/token/generate", body, {**JSON, "X-Request-ID": "big-1"})
    with connect(stack.nginx.address) as sock:
        sock.sendall(raw)
        reply = read_reply(sock)
    assert reply.status == 413
    assert reply.headers["content-type"] == "application/problem+json"
    assert reply.headers["x-request-id"] == "big-1"
    assert reply.json()["code"] == "payload_too_large"


def test_the_compose_file_mounts_the_same_nginx_file() -> None:
    import yaml

    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    proxy = compose["services"]["nginx"]
    assert any(volume.startswith("./deploy/nginx/token-service.conf:") for volume in proxy["volumes"])
    service = compose["services"]["token-service"]
    assert service["environment"]["TOKEN_SERVICE_TRUSTED_PROXY_HOPS"] == "1"
    assert "ports" not in service, "only nginx is published"


def test_metrics_are_not_routed_to_the_internet(stack: Stack) -> None:
    # unauthenticated (openapi.yaml): Prometheus scrapes the service itself, not through the proxy
    direct, proxied = ("127.0.0.1", stack.service.port), stack.nginx.address
    assert exchange(direct, request_bytes("GET", "/metrics")).status == 200
    headers = {"X-Request-ID": "metrics-1"}
    hidden = exchange(proxied, request_bytes("GET", "/metrics", headers=headers))
    unknown = exchange(direct, request_bytes("GET", "/no/such/route", headers=headers))
    # answered as the service answers a route it does not have
    assert (hidden.status, hidden.body) == (unknown.status, unknown.body)
    kept = ("content-type", "cache-control", "x-request-id")
    assert {k: hidden.headers.get(k) for k in kept} == {k: unknown.headers.get(k) for k in kept}
