"""A Content-Length that is not a plain number never escapes the Django integration as a 500.

Django's own development server passes the header through as sent (gunicorn and
uvicorn refuse it first): "²" is a digit to str.isdigit() and an error to int(),
and int() refuses 5000 digits. Both ended @require_token and the Idempotency-Key
middleware with a ValueError before the view ran.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from token_service.client.django import _declared_length


@pytest.mark.parametrize(
    ("header", "length"), [("12", 12), ("0", 0), ("", None), ("²", None), ("9" * 5000, None)]
)
def test_the_declared_length_is_a_number_or_none(header: str, length: int | None) -> None:
    request: Any = SimpleNamespace(META={"CONTENT_LENGTH": header})
    assert _declared_length(request) == length


def test_a_request_without_the_header_declares_no_length() -> None:
    request: Any = SimpleNamespace(META={})
    assert _declared_length(request) is None
