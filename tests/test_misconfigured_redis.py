"""A Redis that refuses the service for how it is set up is ``503 store_unavailable``, never a 500.

Every error reply of the Redis deployment that is not our own script's fault
(token_service/store_errors.py) is translated at the store edge: a database
number the server does not have, an ACL user without the permissions, a wrong
password, a read-only replica, a cluster node reached by a ``redis://`` URL, a
server that does not speak Redis. The routes answer 503, ``/readyz`` fails,
the SDK raises ``ServiceUnavailable`` and ``token-service check`` says one
line naming the setting. On real redis-server processes of the test's own.
(Before this, the first four answered every route, ``/readyz`` included, with
``500 internal_error``, and ``check`` died with a traceback.)
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from tests.support.processes import REPO_ROOT, RedisServer, free_port, wait_until
from tests.support.service import API_KEY, AUTH
from token_service import create_app
from token_service.client import AsyncTokenClient, ServiceUnavailable, TokenClient

pytestmark = pytest.mark.real
SCOPE = "payment.create"
TOKEN = "t" * 43  # well formed, never issued


@dataclass(frozen=True)
class Misconfigured:
    url: str
    # words the 503's detail and check's line say about it
    says: str
    # whether the uses of one token are refused too: a replica still reads, and a cluster node
    # that owns every slot runs a script of one key (what refuses them is a second key)
    uses_refused: bool = True


@pytest.fixture(scope="module")
def acl_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    admin = server.client()
    # a user that may only connect; one that may run scripts but none of the commands in them;
    # one whose keys are not the service's prefix; one with every right and a password
    admin.acl_setuser("nothing", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@connection"])
    admin.acl_setuser(
        "scripts", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@connection", "+@scripting"]
    )
    admin.acl_setuser("otherkeys", enabled=True, passwords=["+pw"], keys=["other:*"], commands=["+@all"])
    admin.acl_setuser("svc", enabled=True, passwords=["+right"], keys=["*"], commands=["+@all"])
    admin.close()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def replica(redis_server: RedisServer) -> Iterator[RedisServer]:
    server = RedisServer("--replicaof", "127.0.0.1", str(redis_server.port)).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def cluster_node() -> Iterator[RedisServer]:
    """One node of a Redis Cluster (it owns every slot), which a redis:// URL reaches as one server."""
    server = RedisServer(
        "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-port", str(free_port())
    ).start()
    with server.client() as admin:
        admin.execute_command("CLUSTER", "ADDSLOTSRANGE", "0", "16383")
        wait_until(lambda: admin.cluster("info")["cluster_state"] == "ok", what="cluster state ok")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def not_redis() -> Iterator[str]:
    """A URL to a server that answers in HTTP (another service's port, mistyped)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def answer() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    stop.set()
    thread.join()
    listener.close()


def _user(server: RedisServer, name: str, password: str = "pw") -> str:  # noqa: S107 (a test user)
    return f"redis://{name}:{password}@127.0.0.1:{server.port}/0"


CASES: dict[str, Callable[[pytest.FixtureRequest], Misconfigured]] = {
    # redis.conf's `databases` is 16: /99 (or /1 on a managed Redis with one database)
    "db-index-out-of-range": lambda r: Misconfigured(
        r.getfixturevalue("redis_server").url.rsplit("/", 1)[0] + "/99", "database number"
    ),
    "acl-user-without-permissions": lambda r: Misconfigured(
        _user(r.getfixturevalue("acl_redis"), "nothing"), "permission"
    ),
    "acl-user-without-the-scripts-commands": lambda r: Misconfigured(
        _user(r.getfixturevalue("acl_redis"), "scripts"), "permission"
    ),
    "acl-user-without-the-key-prefix": lambda r: Misconfigured(
        _user(r.getfixturevalue("acl_redis"), "otherkeys"), "permission"
    ),
    "wrong-password": lambda r: Misconfigured(
        _user(r.getfixturevalue("acl_redis"), "svc", "wrong"), "password"
    ),
    "read-only-replica": lambda r: Misconfigured(
        r.getfixturevalue("replica").url, "replica", uses_refused=False
    ),
    "cluster-node-as-one-server": lambda r: Misconfigured(
        r.getfixturevalue("cluster_node").url, "redis+cluster://", uses_refused=False
    ),
    "not-a-redis-server": lambda r: Misconfigured(r.getfixturevalue("not_redis"), "Redis protocol"),
}


@pytest.fixture(params=sorted(CASES))
def misconfigured(request: pytest.FixtureRequest) -> Misconfigured:
    return CASES[request.param](request)


def assert_refused(reply: Any, says: str) -> None:
    assert reply.status_code == 503, reply.get_data(as_text=True)
    assert reply.json["code"] == "store_unavailable"
    assert "Retry-After" in reply.headers
    assert says in reply.json["detail"]


def test_every_route_answers_503_and_readiness_fails(misconfigured: Misconfigured) -> None:
    # the issuance limits on, as by default: their records are the second key of a script
    http = create_app({"api_keys": API_KEY, "redis_url": misconfigured.url}).test_client()
    assert_refused(http.get("/readyz"), misconfigured.says)
    assert_refused(http.post("/token/generate", json={"scope": SCOPE}), misconfigured.says)
    assert_refused(http.post("/token/generate/batch", json={"scope": SCOPE, "count": 3}), misconfigured.says)
    uses = [
        ("/token/consume", {"token": TOKEN, "scope": SCOPE, "request_id": "r-1"}),
        ("/token/begin", {"token": TOKEN, "scope": SCOPE, "request_id": "r-1"}),
        ("/token/inspect", {"token": TOKEN}),
        ("/token/revoke", {"token": TOKEN}),
    ]
    for path, body in uses:
        reply = http.post(path, json=body, headers=AUTH)
        if misconfigured.uses_refused:
            assert_refused(reply, misconfigured.says)
        else:
            assert reply.status_code == 404, (path, reply.get_data(as_text=True))  # unknown, rightly


def test_the_sdk_raises_service_unavailable(misconfigured: Misconfigured) -> None:
    with TokenClient.from_redis(misconfigured.url, retry=1) as client:
        if "redis+cluster" in misconfigured.says:
            # without limits the SDK's issue and consume take one key, which this node owns
            token = client.generate(SCOPE).token
            assert not client.consume(token, SCOPE).replayed
            return
        with pytest.raises(ServiceUnavailable) as refused:
            client.generate(SCOPE)
    assert misconfigured.says in refused.value.detail


def check(url: str, *command: str) -> subprocess.CompletedProcess[str]:
    """``token-service check`` (or ``command``) with only this Redis URL and a key set."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOKEN_SERVICE_")}
    return subprocess.run(
        [sys.executable, "-m", "token_service.server.cli", *(command or ("check",))],
        env={**clean, "TOKEN_SERVICE_REDIS_URL": url, "TOKEN_SERVICE_API_KEYS": API_KEY},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )


def test_check_says_one_line_naming_the_setting(misconfigured: Misconfigured) -> None:
    result = check(misconfigured.url)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "TOKEN_SERVICE_REDIS_URL=redis://" in lines[0]
    assert misconfigured.says in lines[0]
    assert ":pw@" not in lines[0]  # the password masked
    assert ":wrong@" not in lines[0]


def test_check_of_a_cluster_url_to_one_server_says_so(redis_server: RedisServer) -> None:
    result = check(f"redis+cluster://127.0.0.1:{redis_server.port}")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "TOKEN_SERVICE_REDIS_URL=redis+cluster://" in result.stderr
    assert "cluster mode" in result.stderr


def test_check_of_an_unreachable_redis_names_its_host_and_port() -> None:
    port = free_port()
    result = check(f"redis://127.0.0.1:{port}/0")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    # redis-py's words (the URL is on the line too, but not in these words)
    assert f"connecting to 127.0.0.1:{port}" in result.stderr


def test_a_lua_error_in_our_own_script_stays_a_bug(redis_server: RedisServer) -> None:
    """A fault of our scripts is not a misconfigured store: it is not hidden behind a 503 to retry."""
    from token_service.store import translate_errors

    with redis_server.client() as client, pytest.raises(redis.ResponseError, match="user_script"):  # noqa: SIM117
        with translate_errors():
            client.eval("return nothing.here", 0)


def test_the_async_sdk_raises_service_unavailable(redis_server: RedisServer) -> None:
    async def generate() -> None:
        async with AsyncTokenClient.from_redis(redis_server.url.rsplit("/", 1)[0] + "/99", retry=1) as client:
            await client.generate(SCOPE)

    with pytest.raises(ServiceUnavailable, match="database number"):
        asyncio.run(generate())


def test_a_cluster_client_that_fails_for_a_bug_of_ours_is_not_a_refusal() -> None:
    """redis-py's "Redis Cluster cannot be connected" wraps what failed on every node: a node
    that is no cluster node is a misconfiguration; a TypeError of our options is a bug."""
    from redis.exceptions import RedisClusterException

    from token_service.store_errors import unavailable

    def wrapped(cause: BaseException) -> RedisClusterException:
        try:
            raise RedisClusterException("Redis Cluster cannot be connected.") from cause
        except RedisClusterException as exc:
            return exc

    refused = unavailable(wrapped(RedisClusterException("Cluster mode is not enabled on this node")))
    assert refused is not None
    assert "redis+cluster://" in refused.detail
    assert unavailable(wrapped(TypeError("unexpected keyword argument 'connection_class'"))) is None


def test_serve_of_a_cluster_url_to_one_server_says_one_line(redis_server: RedisServer) -> None:
    """A cluster client is made as each worker boots: before, every gunicorn worker died on it
    with a traceback and the master exited saying only "Worker failed to boot"."""
    result = check(f"redis+cluster://127.0.0.1:{redis_server.port}", "serve", "--port", str(free_port()))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "TOKEN_SERVICE_REDIS_URL=redis+cluster://" in result.stderr
    assert "cluster mode" in result.stderr
