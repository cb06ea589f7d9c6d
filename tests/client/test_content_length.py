"""A Content-Length that is not a plain number never escapes the SDK's middlewares as a 500.

Servers differ in what they pass through: gunicorn and uvicorn refuse a malformed
header, Django's own development server (and other ASGI servers) hand it on. "²"
is a digit to str.isdigit() and an error to int(), and int() refuses 5000 digits:
both ended Django's @require_token and the Idempotency-Key middlewares (Django,
ASGI) with a ValueError before the view ran.
"""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from token_service.client._idempotency_core import declared_length
from token_service.client.django import _declared_length
from token_service.client.wsgi import IdempotencyMiddleware

CASES = [("12", 12), (" 12 ", 12), ("0", 0), ("", None), ("²", None), ("9" * 5000, None), ("-1", None)]
# int() takes these, a Content-Length does not
CASES += [("+3", None), ("1_0", None)]


@pytest.mark.parametrize(("header", "length"), CASES)
def test_a_declared_length_is_a_number_or_none(header: str, length: int | None) -> None:
    assert declared_length(header) == length


@pytest.mark.parametrize(("header", "length"), CASES)
def test_django_reads_the_declared_length_the_same_way(header: str, length: int | None) -> None:
    request: Any = SimpleNamespace(META={"CONTENT_LENGTH": header})
    assert _declared_length(request) == length


def test_a_django_request_without_the_header_declares_no_length() -> None:
    request: Any = SimpleNamespace(META={})
    assert _declared_length(request) is None


@pytest.mark.parametrize(("header", "length"), CASES)
def test_the_wsgi_middleware_reads_the_declared_length_the_same_way(header: str, length: int | None) -> None:
    # a length that is not a number reads as none declared: no body, unless the server ends the stream
    middleware = IdempotencyMiddleware(lambda environ, start_response: [], redis.Redis(port=1))
    environ: Any = {"CONTENT_LENGTH": header, "wsgi.input": io.BytesIO(b"x" * 20)}
    assert middleware._read_body(environ) == b"x" * (length or 0)
