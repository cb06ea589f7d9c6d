"""Upgrading loses nothing (issue 32, item 6), for the Idempotency-Key middlewares: records the
release before the common record wrote with its own scripts (tests/upgrade/old_lua/
idempotency_*.lua, copied as they were) are read by this release until they expire, on a real
redis-server.

A response stored before the upgrade is replayed after it (and another request under its key
is refused with 422); a request still running on an instance not yet upgraded is not run a
second time by an upgraded one (409), and once the old instance stores its response the
duplicate gets it. The operators' tools show both. An old instance that meets a record of this
release (a rollout with both at once) refuses it as a mismatch: a 422, never a second run.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any

import pytest
import redis

from tests.upgrade.test_records_of_the_first_layout import OLD_LUA, _old_source
from token_service.client import wsgi
from token_service.client._stored_response import StoredResponse
from token_service.errors import NotInProgress
from token_service.ops.admin import IDEMPOTENCY, Admin

USER = "Bearer alice"

pytestmark = pytest.mark.real


class Orders:
    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        self.runs += 1
        body = b'{"order":"new"}'
        start_response("201 Created", [("Content-Type", "application/json")])
        return [body]


def environ(body: bytes, key: str = "order-1") -> dict[str, Any]:
    return {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/orders",
        "QUERY_STRING": "",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_AUTHORIZATION": USER,
        "HTTP_IDEMPOTENCY_KEY": f'"{key}"',
        "wsgi.input": io.BytesIO(body),
    }


def post(app: wsgi.IdempotencyMiddleware, body: bytes) -> tuple[int, dict[str, str], bytes]:
    started: list[Any] = []
    result = app(environ(body), lambda status, headers, exc_info=None: started.append((status, headers)))
    sent = b"".join(result)
    getattr(result, "close", lambda: None)()
    return int(started[0][0].split()[0]), dict(started[0][1]), sent


class OldInstance:
    """What an instance of the release before does with a key: its scripts, its record format."""

    def __init__(self, client: redis.Redis, app: wsgi.IdempotencyMiddleware, body: bytes) -> None:
        self.client = client
        self.key = app.store.key(USER, "order-1")
        # the fingerprint that release computed too (the fingerprint did not change)
        attempt = app.core.attempt(app.store, USER, "order-1", wsgi._facts(environ(body), body))
        assert not isinstance(attempt, wsgi.Answer)
        self.fingerprint = attempt.fingerprint

    def begin(self, owner: str = "old-owner") -> list[Any]:
        reply: list[Any] = self.client.eval(
            _old_source("idempotency_begin"), 1, self.key, self.fingerprint, owner, "60000"
        )
        return reply

    def store(self, response: StoredResponse, owner: str = "old-owner") -> bytes:
        args = [self.fingerprint, owner, response.encode_head(), response.body, "600000"]
        reply: list[Any] = self.client.eval(_old_source("idempotency_store"), 1, self.key, *args)
        return bytes(reply[0])


BODY = b'{"item":"book"}'
OLD_RESPONSE = StoredResponse(201, b'{"order":"old"}', [("Content-Type", "application/json")])


@pytest.fixture
def app(real_redis: redis.Redis) -> wsgi.IdempotencyMiddleware:
    return wsgi.IdempotencyMiddleware(Orders(), real_redis)


def test_the_old_scripts_are_not_shipped_any_more() -> None:
    from token_service.scripts import lua_dir

    assert (OLD_LUA / "idempotency_begin.lua").exists()
    assert not list(lua_dir().glob("idempotency_*.lua"))


def test_a_response_stored_before_is_replayed_after(
    real_redis: redis.Redis, app: wsgi.IdempotencyMiddleware
) -> None:
    old = OldInstance(real_redis, app, BODY)
    assert old.begin() == [b"started"]
    assert old.store(OLD_RESPONSE) == b"stored"
    assert real_redis.get(old.key).startswith(b"D")  # type: ignore[union-attr]
    status, headers, body = post(app, BODY)
    assert (status, body) == (201, b'{"order":"old"}')
    assert headers["Idempotent-Replayed"] == "true"
    assert post(app, b'{"item":"lamp"}')[0] == 422  # another request under that key
    assert app.app.runs == 0  # type: ignore[attr-defined]
    shown = Admin(real_redis).show_idempotency(USER, "order-1")
    assert shown.state == "COMPLETED"
    assert shown.response is not None
    assert shown.response["status"] == 201


def test_a_request_running_on_an_old_instance_is_not_run_again(
    real_redis: redis.Redis, app: wsgi.IdempotencyMiddleware
) -> None:
    old = OldInstance(real_redis, app, BODY)
    assert old.begin() == [b"started"]
    status, headers, _ = post(app, BODY)
    assert status == 409
    assert int(headers["Retry-After"]) >= 1
    admin = Admin(real_redis)
    shown = admin.show_idempotency(USER, "order-1")
    assert shown.state == "PROCESSING"
    with pytest.raises(NotInProgress):
        admin.release(shown.ref, IDEMPOTENCY)  # its old holder still may store it: not taken from it
    assert old.store(OLD_RESPONSE) == b"stored"  # the old instance finishes it
    status, headers, body = post(app, BODY)
    assert (status, body) == (201, b'{"order":"old"}')
    assert headers["Idempotent-Replayed"] == "true"
    assert app.app.runs == 0  # type: ignore[attr-defined]


def test_an_old_instance_refuses_a_record_of_this_release_as_a_mismatch(
    real_redis: redis.Redis, app: wsgi.IdempotencyMiddleware
) -> None:
    old = OldInstance(real_redis, app, BODY)
    assert post(app, BODY)[0] == 201  # stored by this release, in the common record
    assert real_redis.get(old.key).startswith(b"S\x1e")  # type: ignore[union-attr]
    assert old.begin(owner="old-owner-2") == [b"mismatch"]  # a 422 there: the request never runs twice
    assert old.store(OLD_RESPONSE, owner="old-owner-2") == b"lost"  # and it never overwrites it
    assert post(app, BODY)[2] == b'{"order":"new"}'
    assert app.app.runs == 1  # type: ignore[attr-defined]
