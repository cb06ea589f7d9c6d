"""TokenStore's EVALSHA on a pooled connection (``TokenStore._execute``), against a real redis-server.

A plain redis-py client's token operations skip redis-py's command layer but
keep its connection layer: the connection-level Retry, the connection dropped
after a failure (so a late reply is never read as the next command's), and
fail closed when Redis does not answer. On a plain ConnectionPool the last
good connection is parked for the next call: never one that failed, never in
a forked child, never shared by two threads at once, handed back when the
store goes away.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.processes import RedisServer
from tests.support.tcp_proxy import FaultProxy
from token_service import store as store_module
from token_service.config import Settings
from token_service.connection import redis_client
from token_service.errors import ServiceUnavailable, TokenInvalid
from token_service.records import IssueRequest, UseRequest
from token_service.store import TokenStore

pytestmark = pytest.mark.real

SCOPE = "payment.create"
# Keeps Redis busy (answering nobody) for three seconds: a call with a 0.2 s timeout and its retry
# both run out inside it with seconds to spare on a loaded machine (one second left only ~0.5 s).
# Under Redis's 5 s busy-reply threshold, so the others wait instead of hearing BUSY.
HOG_THREE_SECONDS = """
local start = redis.call('TIME')
while true do
  local now = redis.call('TIME')
  if (now[1] - start[1]) * 1000000 + (now[2] - start[2]) > 3000000 then return 1 end
end
"""


def service_client(server: RedisServer, **settings: Any) -> Any:
    """A client configured as the service configures its own (timeouts, one quick retry)."""
    return redis_client(Settings.from_mapping({"redis_url": server.url, **settings}))


def issue(store: TokenStore) -> str:
    return store.issue(IssueRequest(SCOPE, None, None, 300))[0]


def warm(store: TokenStore) -> None:
    """Load consume.lua (a first EVALSHA is answered NOSCRIPT, then SCRIPT LOAD runs)."""
    store.consume(UseRequest(issue(store), SCOPE))


def count_checkouts(client: Any) -> list[int]:
    """A list that grows by one each time a call checks a connection out of the client's pool."""
    checkouts: list[int] = []
    pool = client.connection_pool
    original = pool.get_connection
    pool.get_connection = lambda *a, **k: checkouts.append(1) or original(*a, **k)
    return checkouts


def test_a_plain_client_skips_the_command_layer(redis_server: RedisServer, monkeypatch: Any) -> None:
    client = service_client(redis_server)
    store = TokenStore(client)
    warm(store)
    token = issue(store)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("execute_command was used")

    monkeypatch.setattr(client, "execute_command", refuse)
    assert store.consume(UseRequest(token, SCOPE, request_id="r1")).replayed is False
    assert store.consume(UseRequest(token, SCOPE, request_id="r1")).replayed is True
    client.close()


def sent_bytes(client: Any, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """What the client's connections write to Redis, one entry per packed command."""
    sent: list[bytes] = []
    original = redis.connection.AbstractConnection.send_packed_command

    def recording(self: Any, command: Any, check_health: bool = True) -> None:
        sent.append(b"".join(command) if isinstance(command, list) else bytes(command))
        original(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", recording)
    return sent


@pytest.mark.parametrize("packer", ["hiredis", "python"])
def test_commands_are_sent_as_redis_py_packs_them(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, packer: str
) -> None:
    # with hiredis the store packs with hiredis.pack_command itself; without, send_command packs
    client = service_client(redis_server)
    store = TokenStore(client)
    warm(store)
    if packer == "python":
        monkeypatch.setattr(store_module, "_HIREDIS_PACKER", None)
    token = issue(store)
    sent = sent_bytes(client, monkeypatch)
    assert store.consume(UseRequest(token, SCOPE, request_id="r1")).replayed is False
    (command,) = sent
    sha = store._scripts["consume"].sha
    conn = client.connection_pool.get_connection()
    try:
        keys = store._keys("consume", token, None)
        args = [SCOPE, "", "", "r1", ""]
        expected = conn._command_packer.pack("EVALSHA", sha, len(keys), *keys, *args)  # type: ignore[attr-defined]
    finally:
        client.connection_pool.release(conn)
    assert command == b"".join(expected)
    client.close()


def test_an_argument_hiredis_cannot_pack_is_refused_as_redis_py_refuses_it(redis_server: RedisServer) -> None:
    client = service_client(redis_server)
    store = TokenStore(client)
    with pytest.raises(redis.exceptions.DataError):
        store._execute(("GET", {"not": "a string"}))
    client.close()


def test_a_single_connection_client_goes_through_execute_command(redis_server: RedisServer) -> None:
    client = redis_server.client(single_connection_client=True)
    store = TokenStore(client)
    warm(store)
    token = issue(store)
    calls = []
    original = client.execute_command

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        return original(*args, **kwargs)

    client.execute_command = counting  # type: ignore[method-assign]
    assert store.consume(UseRequest(token, SCOPE)).replayed is False
    assert calls == ["EVALSHA"]
    client.close()


def test_a_killed_connection_is_replaced_and_the_call_retried(redis_server: RedisServer) -> None:
    client = service_client(redis_server)
    store = TokenStore(client)
    warm(store)
    token = issue(store)  # leaves one connection in the pool
    admin = redis_server.client()
    before = {c["id"] for c in admin.client_list() if c["name"] != "admin"}
    admin.client_setname("admin")
    assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
    assert store.consume(UseRequest(token, SCOPE)).replayed is False
    after = {c["id"] for c in admin.client_list() if c["name"] != "admin"}
    assert after
    assert not after & before  # the store reconnected: none of its old connections is left
    admin.close()
    client.close()


def test_a_late_reply_is_never_read_as_the_next_commands(redis_server: RedisServer) -> None:
    client = service_client(redis_server, redis_timeout_seconds=0.2)
    store = TokenStore(client)
    warm(store)
    first, second = issue(store), issue(store)
    admin = redis_server.client()
    # Redis stalls for longer than the client waits, twice over (the call and its retry). The stall is
    # sent from this thread, before the consume, so Redis reads it first (a thread left to send it
    # could be slower than a fixed pause on a loaded machine, and the consume would just succeed).
    hog = admin.connection_pool.get_connection()
    hog.send_command("EVAL", HOG_THREE_SECONDS, 0)
    time.sleep(0.1)
    with pytest.raises(ServiceUnavailable):
        store.consume(
            UseRequest(first, SCOPE)
        )  # sent, maybe run after the stall: the caller is told "unknown"
    assert hog.read_response() == 1
    admin.connection_pool.release(hog)
    # every later call reads its own reply, never the stalled consume's
    assert store.inspect(second).state == "ISSUED"
    assert store.consume(UseRequest(second, SCOPE)).replayed is False
    assert store.inspect(second).state == "CONSUMED"
    admin.close()
    client.close()


def test_nothing_listening_is_service_unavailable() -> None:
    server = RedisServer()  # never started: nothing on its port
    store = TokenStore(service_client(server, redis_timeout_seconds=0.2))
    with pytest.raises(ServiceUnavailable):
        store.consume(UseRequest("A" * 43, SCOPE))


@pytest.mark.parametrize("retries", [0, 1])
def test_a_lost_reply_is_retried_by_the_connections_own_retry(
    redis_server: RedisServer, retries: int
) -> None:
    with FaultProxy(("127.0.0.1", redis_server.port)) as proxy:
        store = TokenStore(redis.Redis(port=proxy.port, retry=Retry(NoBackoff(), retries)))
        warm(store)
        token = issue(store)
        proxy.drop_replies(1, match=b"EVALSHA", then="reset")
        if retries:
            # Redis consumed it; the reply was lost; the retry finds its own win
            assert store.consume(UseRequest(token, SCOPE, request_id="r-1")).replayed is True
        else:
            with pytest.raises(ServiceUnavailable):  # fail closed: never "consumed" unheard
                store.consume(UseRequest(token, SCOPE, request_id="r-1"))
            assert store.consume(UseRequest(token, SCOPE, request_id="r-1")).replayed is True
        assert proxy.stats.replies_dropped == 1


# --- the parked connection -------------------------------------------------------


def test_the_last_connection_is_parked_for_the_next_call(redis_server: RedisServer) -> None:
    client = service_client(redis_server)
    store = TokenStore(client)
    warm(store)
    tokens = [issue(store) for _ in range(50)]
    checkouts = count_checkouts(client)
    for token in tokens:
        assert store.consume(UseRequest(token, SCOPE)).replayed is False
    assert checkouts == []  # every consume ran on the parked connection
    assert len(store._parked) == 1
    client.close()


def test_calls_in_flight_at_once_each_park_their_connection(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a second call while the first waits for its reply (another greenlet or thread): it
    # checks a connection out of the pool; afterwards both are parked, none is checked out
    client = service_client(redis_server)
    store = TokenStore(client)
    warm(store)
    outer, inner, *later = [issue(store) for _ in range(20)]
    send_and_read = store_module._send_and_read
    nested = [inner]

    def meanwhile(conn: Any, command: tuple[Any, ...]) -> Any:
        if nested:
            assert store.consume(UseRequest(nested.pop(), SCOPE)).replayed is False
        return send_and_read(conn, command)

    monkeypatch.setattr(store_module, "_send_and_read", meanwhile)
    assert store.consume(UseRequest(outer, SCOPE)).replayed is False
    monkeypatch.setattr(store_module, "_send_and_read", send_and_read)
    assert len(store._parked) == 2
    checkouts = count_checkouts(client)
    for token in later:
        assert store.consume(UseRequest(token, SCOPE)).replayed is False
    assert checkouts == []
    assert len(store._parked) == 2
    assert client.connection_pool.in_use_count() == 2
    client.close()


def test_parked_connections_are_bounded(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    client = service_client(redis_server)
    store = TokenStore(client)
    warm(store)
    tokens = [issue(store) for _ in range(store_module._MAX_PARKED + 5)]
    send_and_read = store_module._send_and_read
    waiting = list(tokens[1:])

    def meanwhile(conn: Any, command: tuple[Any, ...]) -> Any:
        if waiting:  # every call starts the next one before it reads its reply: all in flight at once
            assert store.consume(UseRequest(waiting.pop(), SCOPE)).replayed is False
        return send_and_read(conn, command)

    monkeypatch.setattr(store_module, "_send_and_read", meanwhile)
    assert store.consume(UseRequest(tokens[0], SCOPE)).replayed is False
    assert len(store._parked) == store_module._MAX_PARKED
    assert client.connection_pool.in_use_count() == store_module._MAX_PARKED
    client.close()


def test_a_failed_call_hands_its_connection_back_to_the_pool(redis_server: RedisServer) -> None:
    with FaultProxy(("127.0.0.1", redis_server.port)) as proxy:
        client = redis.Redis(port=proxy.port, retry=Retry(NoBackoff(), 1))
        store = TokenStore(client)
        warm(store)
        token = issue(store)
        assert len(store._parked) == 1
        proxy.drop_replies(2, match=b"EVALSHA", then="reset")  # the call and its retry
        with pytest.raises(ServiceUnavailable):
            store.consume(UseRequest(token, SCOPE, request_id="r-1"))
        assert store._parked == []
        assert store.consume(UseRequest(token, SCOPE, request_id="r-1")).replayed is True
        client.close()


def test_an_exception_between_send_and_read_drops_the_connection(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # KeyboardInterrupt, a task time limit, a signal handler's exception: the command is
    # sent, its reply never read. The next call must not read that reply as its own.
    client = service_client(redis_server)
    store = TokenStore(client)
    warm(store)
    interrupted, real = issue(store), issue(store)
    send_and_read = store_module._send_and_read

    def interrupt(conn: Any, command: tuple[Any, ...]) -> Any:
        conn.send_command(*command)
        raise KeyboardInterrupt

    monkeypatch.setattr(store_module, "_send_and_read", interrupt)
    with pytest.raises(KeyboardInterrupt):
        store.consume(UseRequest(interrupted, SCOPE))
    monkeypatch.setattr(store_module, "_send_and_read", send_and_read)
    for _ in range(3):
        with pytest.raises(TokenInvalid):
            store.consume(UseRequest("A" * 43, SCOPE))  # would read "consumed" one reply behind
    assert store.consume(UseRequest(real, SCOPE)).replayed is False
    assert store.inspect(real).state == "CONSUMED"
    client.close()


def test_without_retries_nothing_is_parked(redis_server: RedisServer) -> None:
    # the pool's checkout replaces a connection the server closed; with no retry to fall
    # back on, skipping that check would turn a closed idle connection into a 503
    client = redis.Redis(port=redis_server.port, retry=Retry(NoBackoff(), 0))
    store = TokenStore(client)
    warm(store)
    assert store._parked == []
    token = issue(store)
    admin = redis_server.client()
    admin.client_setname("admin")
    admin.client_kill_filter(_type="normal", skipme=True)
    assert store.consume(UseRequest(token, SCOPE)).replayed is False
    admin.close()
    client.close()


def test_threads_share_the_store_without_mixing_replies(redis_server: RedisServer) -> None:
    client = service_client(redis_server)
    store = TokenStore(client)
    warm(store)
    per_thread = [[issue(store) for _ in range(100)] for _ in range(8)]
    outcomes: list[bool] = []
    errors: list[BaseException] = []

    def work(tokens: list[str]) -> None:
        try:
            for token in tokens:
                outcomes.append(store.consume(UseRequest(token, SCOPE)).replayed)
                assert store.inspect(token).state == "CONSUMED"
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(tokens,)) for tokens in per_thread]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert outcomes == [False] * 800
    assert len(store._parked) <= 8
    client.close()


def test_a_forked_child_never_uses_the_parents_connection(redis_server: RedisServer) -> None:
    client = service_client(redis_server)
    store = TokenStore(client)
    warm(store)
    parent_tokens = [issue(store) for _ in range(200)]
    child_tokens = [issue(store) for _ in range(200)]
    (_, parent_conn) = store._parked[0]
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: consumes its own tokens while the parent consumes its
        status = 1
        try:
            results = [store.consume(UseRequest(t, SCOPE)).replayed for t in child_tokens]
            used = store._parked[0][1] if store._parked else None
            status = 0 if results == [False] * 200 and used is not parent_conn else 2
        finally:
            os.write(write_end, bytes([status]))
            os._exit(0)
    os.close(write_end)
    results = [store.consume(UseRequest(t, SCOPE)).replayed for t in parent_tokens]
    child_status = os.read(read_end, 1)
    os.waitpid(pid, 0)
    os.close(read_end)
    assert child_status == b"\x00"
    assert results == [False] * 200
    assert store._parked[0][1] is parent_conn
    client.close()


def test_a_dropped_store_hands_its_parked_connection_back(redis_server: RedisServer) -> None:
    client = service_client(redis_server)
    store = TokenStore(client)
    warm(store)
    pool = client.connection_pool
    assert pool.in_use_count() == 1  # the parked one
    del store
    gc.collect()
    assert pool.in_use_count() == 0
    client.close()


def test_a_blocking_pool_is_never_parked_on(redis_server: RedisServer) -> None:
    pool = redis.BlockingConnectionPool(port=redis_server.port, max_connections=1, timeout=1)
    client = redis.Redis(connection_pool=pool)
    store = TokenStore(client)
    warm(store)
    assert store._parked == []
    assert client.ping()  # the pool's one connection is free for the client's own commands
    client.close()
