"""deploy/nginx/token-service.conf, run by a real nginx in front of each server ``serve`` runs.

The shipped file is used as it is, except for its two addresses (tests/support/nginx.py). The
service runs as shipped with TOKEN_SERVICE_TRUSTED_PROXY_HOPS=1, as docs/deployment.md says to,
under gunicorn and under granian. For granian this is the supported deployment (it holds no body
deadline and accepts a bare LF by itself: tests/edge/test_gunicorn_edge.py), so what a client can
throw at the edge (bodies that stall or drip, heads too large, bad framing, smuggling with two
lengths, floods of idle and kept-alive sockets) is thrown here, at nginx, on both servers.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.edge.test_gunicorn_edge import MALFORMED
from tests.support.edge_timeouts import edge_timeout_seconds
from tests.support.nginx import CONF, Nginx
from tests.support.processes import REPO_ROOT, SERVERS, Gunicorn, RedisServer, wait_until
from tests.support.raw_http import Reply, connect, exchange, read_reply, request_bytes
from tests.support.service import API_KEY, AUTH

pytestmark = [pytest.mark.real, pytest.mark.slow]

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


@dataclass
class Stack:
    redis: RedisServer
    service: Gunicorn
    nginx: Nginx


@pytest.fixture(scope="module", params=sorted(SERVERS))
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    redis_server = RedisServer().start()
    service = SERVERS[request.param](
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


# --- what an attacker throws at the edge, thrown at nginx: held on both servers ------------------


def reached_the_service(stack: Stack, request_id: str) -> bool:
    """Whether the service logged a request with this id; known only once a later request through
    nginx (a marker of its own) has been logged, so a "no" is not just "not yet"."""
    marker = f"marker-{request_id}"
    assert exchange(stack.nginx.address, request_bytes("GET", "/healthz", headers={"X-Request-ID": marker}))
    wait_until(
        lambda: f'"request_id": "{marker}"' in stack.service.log(), 30, what="the marker's access line"
    )
    return f'"request_id": "{request_id}"' in stack.service.log()


def assert_nginx_problem(reply: Reply, statuses: tuple[int, ...], code: str) -> None:
    assert reply.status in statuses, reply
    assert reply.headers["content-type"] == "application/problem+json", reply
    assert reply.json()["code"] == code
    assert b"<html" not in reply.body


@pytest.mark.parametrize(("raw", "status"), [case for case in MALFORMED if case.id != "bare-lf"])
def test_what_nginx_cannot_read_is_refused_as_problem_json(
    stack: Stack, raw: bytes, status: int | tuple[int, ...]
) -> None:
    # nginx's own statuses: 400 (its 494 for a header over 8 KiB too), 414, 501 for gzip
    assert_nginx_problem(exchange(stack.nginx.address, raw), (400, 414, 501), "invalid_request")


def test_a_bare_lf_is_read_by_nginx_alone(stack: Stack) -> None:
    """nginx takes a bare LF as a line end (RFC 9112 lets it) and sends the service CRLF lines:
    the one parser of the client's bytes, so no second one can read them otherwise."""
    reply = exchange(stack.nginx.address, b"GET /healthz HTTP/1.1\nHost: x\nX-Request-ID: bare-lf-1\n\n")
    assert reply.status == 200
    assert reached_the_service(stack, "bare-lf-1")


HIDDEN = request_bytes("POST", "/token/generate", b'{"scope": "hidden"}', {**JSON, "X-Request-ID": "{rid}"})
SMUGGLING = {
    # a body framed two ways: a server reading the other framing would find HIDDEN as a request
    "CL.TE": b"Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + HIDDEN,
    "TE.CL": b"Transfer-Encoding: chunked\r\nContent-Length: 300\r\n\r\n0\r\n\r\n" + HIDDEN,
    "TE.TE": b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n0\r\n\r\n" + HIDDEN,
    "two CL": b"Content-Length: 0\r\nContent-Length: 250\r\n\r\n" + HIDDEN,
    # a bare LF before the length: a parser that does not take it as a line end reads no length
    "bare LF": b"X-Pad: a\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + HIDDEN,
}


@pytest.mark.parametrize("framing", sorted(SMUGGLING))
def test_a_request_hidden_by_two_framings_never_reaches_the_service(stack: Stack, framing: str) -> None:
    rid = f"hidden-{framing.replace(' ', '-').replace('.', '-')}-{stack.service.port}"
    head = b"POST /token/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    with connect(stack.nginx.address) as sock:
        sock.sendall(head + SMUGGLING[framing].replace(b"{rid}", rid.encode()))
        reply = read_reply(sock)
        assert_nginx_problem(reply, (400,), "invalid_request")
        assert reply.headers.get("connection") == "close"
    assert not reached_the_service(stack, rid)


def test_a_body_that_stalls_is_cut_off_at_nginx_and_never_reaches_the_service(stack: Stack) -> None:
    headers = {**JSON, "X-Request-ID": "stall-1"}
    raw = request_bytes("POST", "/token/generate", b'{"scope": "stalled"}', headers)
    received = b""
    with connect(stack.nginx.address) as sock:
        sock.sendall(raw[:-5])
        # client_body_timeout (10 s) after the last byte: reset_timedout_connection on, so nginx
        # resets the connection (a 408 problem+json would do too); well within a minute
        sock.settimeout(60)
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
    assert not received or received.startswith(b"HTTP/1.1 408 "), received[:300]
    assert b"<html" not in received
    assert not reached_the_service(stack, "stall-1")


DRIPPERS = 8  # more than granian's blocking threads (2 workers x 2) and gunicorn's, were they held


def test_bodies_that_drip_hold_nothing_of_the_service(stack: Stack) -> None:
    """A byte every half second keeps nginx's client_body_timeout from firing, so these bodies
    never end; nginx holds them all, and the service serves everyone else meanwhile."""
    address = stack.nginx.address
    raw = request_bytes("POST", "/token/generate", b'{"scope": "drip.one"}' + b" " * 400, JSON)
    stop = threading.Event()

    def drip() -> None:
        with connect(address, "127.0.0.5") as sock:
            sock.sendall(raw[: raw.index(b"\r\n\r\n") + 4])
            for byte in raw[raw.index(b"\r\n\r\n") + 4 : -1]:
                if stop.wait(0.5):
                    return
                sock.sendall(bytes([byte]))

    drippers = [threading.Thread(target=drip, daemon=True) for _ in range(DRIPPERS)]
    for dripper in drippers:
        dripper.start()
    try:
        time.sleep(1)  # every dripper has its head in and is dripping
        statuses = [generate(address, f"127.0.3.{i + 1}").status for i in range(20)]
        assert statuses == [201] * 20
        assert all(dripper.is_alive() for dripper in drippers)  # still dripping: never refused
        assert upstream_connections(stack.service.port) < 32
    finally:
        stop.set()
        for dripper in drippers:
            dripper.join(timeout=30)
    assert "drip.one" not in stack.service.log()


def test_kept_alive_connections_carry_many_requests_and_a_flood_of_them_blocks_no_one(stack: Stack) -> None:
    address = stack.nginx.address
    with connect(address) as sock:
        for _ in range(50):
            sock.sendall(request_bytes("GET", "/healthz"))
            assert read_reply(sock).status == 200
    # 300 clients that each asked once and keep their connection open (keepalive_timeout 30 s)
    flood = []
    try:
        for i in range(300):
            sock = connect(address, f"127.0.4.{1 + i % 200}")
            sock.sendall(request_bytes("GET", "/healthz"))
            assert read_reply(sock).status == 200
            flood.append(sock)
        assert upstream_connections(stack.service.port) < 32  # nginx's pool, not one per client
        assert [generate(address, f"127.0.5.{i + 1}").status for i in range(20)] == [201] * 20
    finally:
        for sock in flood:
            sock.close()


@pytest.mark.parametrize("tail", [b"", b"zz\r\n"], ids=["cut-short", "bad-framing-after"])
def test_a_chunked_body_that_does_not_end_never_reaches_the_service(stack: Stack, tail: bytes) -> None:
    """granian alone runs such a request (test_gunicorn_edge); nginx reads the whole body first."""
    rid = f"unended-{len(tail)}-{stack.service.port}"
    body = b'{"scope": "unended"}'
    head = request_bytes(
        "POST", "/token/generate", None, {**JSON, "Transfer-Encoding": "chunked", "X-Request-ID": rid}
    )
    with connect(stack.nginx.address) as sock:
        sock.sendall(head + b"%x\r\n%s\r\n" % (len(body), body) + tail)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(30)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
    assert not received.startswith(b"HTTP/1.1 201"), received[:300]
    assert not reached_the_service(stack, rid)
