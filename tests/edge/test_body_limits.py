"""Body limits on every framing: a body is read whole, within the limit, before anything parses it.

In process (fakeredis and real Redis) on both paths: the hot path (plain JSON
generate/consume) and the Flask path (every other request, or a cross-origin
one). The same under real gunicorn is in test_gunicorn_edge.py.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from werkzeug.test import EnvironBuilder

from tests.support.service import API_KEY, AUTH
from token_service import create_app
from token_service.records import IssueRequest
from token_service.server.body import GuardedInput, read_body
from token_service.store import TokenStore

SCOPE = "payment.create"
LIMIT = 1024
ORIGIN = "https://shop.example.com"

# (path, extra headers): the hot path, and the same routes sent down the Flask path
PATHS = [
    pytest.param("/token/consume", {"Content-Type": "application/json"}, id="hot-consume"),
    pytest.param(
        "/token/consume", {"Content-Type": "application/json", "Origin": ORIGIN}, id="flask-consume-cors"
    ),
    pytest.param("/token/consume", {"Content-Type": "application/vnd.api+json"}, id="flask-consume"),
    pytest.param("/token/begin", {"Content-Type": "application/json"}, id="flask-begin"),
]


@pytest.fixture
def app(redis_client: Any) -> Any:
    return create_app(
        {
            "api_keys": API_KEY,
            "redis_client": redis_client,
            "max_body_bytes": LIMIT,
            "cors_origins": ORIGIN,
            "rate_limit": "off",
        }
    )


def call(app: Any, path: str, headers: dict[str, str], body: bytes, *, chunked: bool) -> tuple[int, Any]:
    """The request through the whole WSGI stack, framed as gunicorn hands a chunked body on."""
    environ = EnvironBuilder(path=path, method="POST", headers={**AUTH, **headers}, data=body).get_environ()
    if chunked:
        del environ["CONTENT_LENGTH"]
        environ["HTTP_TRANSFER_ENCODING"] = "chunked"
        environ["wsgi.input_terminated"] = True  # gunicorn decodes the chunks and ends the stream
    environ["wsgi.input"] = io.BytesIO(body)
    statuses: list[str] = []
    reply = b"".join(app.wsgi_app(environ, lambda status, headers: statuses.append(status)))
    return int(statuses[0].split()[0]), json.loads(reply)


def a_token(redis_client: Any) -> str:
    return TokenStore(redis_client).issue(IssueRequest(SCOPE, None, None, 300))[0]


def over_the_limit_but_valid_json_first(token: str) -> bytes:
    """The issue's attack: the first LIMIT bytes are a complete, valid consume; garbage follows."""
    valid = json.dumps({"token": token, "scope": SCOPE}).encode()
    return valid + b" " * (LIMIT - len(valid)) + b"garbage" * 500


@pytest.mark.parametrize(("path", "headers"), PATHS)
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
def test_a_body_over_the_limit_is_413_and_nothing_is_processed(
    app: Any, redis_client: Any, path: str, headers: dict[str, str], chunked: bool
) -> None:
    token = a_token(redis_client)
    body = over_the_limit_but_valid_json_first(token)
    status, problem = call(app, path, headers, body, chunked=chunked)
    assert (status, problem["code"]) == (413, "payload_too_large")
    # the token is untouched: a proper consume still wins
    status, reply = call(
        app,
        "/token/consume",
        {"Content-Type": "application/json"},
        json.dumps({"token": token, "scope": SCOPE}).encode(),
        chunked=False,
    )
    assert (status, reply["outcome"]) == (200, "consumed")


@pytest.mark.parametrize(("path", "headers"), PATHS)
def test_a_chunked_body_of_exactly_the_limit_is_served(
    app: Any, redis_client: Any, path: str, headers: dict[str, str]
) -> None:
    token = a_token(redis_client)
    valid = json.dumps({"token": token, "scope": SCOPE}).encode()
    body = valid + b" " * (LIMIT - len(valid))
    status, reply = call(app, path, headers, body, chunked=True)
    assert status in (200, 201), reply
    assert reply.get("outcome", reply.get("state")) is not None


@pytest.mark.parametrize(("path", "headers"), PATHS)
def test_a_truncated_body_is_never_parsed(
    app: Any, redis_client: Any, path: str, headers: dict[str, str]
) -> None:
    token = a_token(redis_client)
    body = json.dumps({"token": token, "scope": SCOPE}).encode()
    environ = EnvironBuilder(path=path, method="POST", headers={**AUTH, **headers}, data=body).get_environ()
    # a Content-Length longer than what arrives: the body ends (the client went away) early
    environ["CONTENT_LENGTH"] = str(len(body) + 10)
    statuses: list[str] = []
    reply = json.loads(b"".join(app.wsgi_app(environ, lambda status, headers: statuses.append(status))))
    assert statuses[0].startswith("400")
    assert reply["code"] == "invalid_request"
    status, consumed = call(app, "/token/consume", {"Content-Type": "application/json"}, body, chunked=False)
    assert (status, consumed["outcome"]) == (200, "consumed")


class Endless(io.RawIOBase):
    """A stream that never ends: how much of it was read is the point."""

    def __init__(self) -> None:
        super().__init__()
        self.read_bytes = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        size = 65536 if size is None or size < 0 else min(size, 65536)
        self.read_bytes += size
        return b"x" * size


def test_an_endless_chunked_body_is_read_one_byte_past_the_limit_and_no_further() -> None:
    stream = Endless()
    environ = {"wsgi.input": stream, "HTTP_TRANSFER_ENCODING": "chunked", "wsgi.input_terminated": True}
    with pytest.raises(Exception, match="over the configured limit") as raised:
        read_body(environ, LIMIT, 5.0)
    assert type(raised.value).__name__ == "PayloadTooLarge"
    assert stream.read_bytes == LIMIT + 1


def test_a_huge_content_length_is_refused_before_reading() -> None:
    stream = Endless()
    environ = {"wsgi.input": stream, "CONTENT_LENGTH": str(10**12)}
    with pytest.raises(Exception, match="over the configured limit"):
        read_body(environ, LIMIT, 5.0)
    assert stream.read_bytes == 0


def test_the_guarded_input_reads_nothing_until_asked() -> None:
    stream = Endless()
    guarded = GuardedInput({"wsgi.input": stream, "CONTENT_LENGTH": "10"}, LIMIT, 5.0)
    assert stream.read_bytes == 0
    assert guarded.read(4) == b"xxxx"
    assert guarded.read() == b"x" * 6
    assert stream.read_bytes == 10


def test_without_a_length_or_a_terminated_stream_there_is_no_body() -> None:
    # as Werkzeug reads it: a server that does not end the stream could block forever on it
    assert read_body({"wsgi.input": Endless()}, LIMIT, 5.0) == b""
