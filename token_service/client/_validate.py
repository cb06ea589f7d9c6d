"""Argument checks for the direct transport, the same rules the HTTP API's schemas apply.

Over HTTP the service validates; straight against Redis nobody else would,
and a control character in a subject would corrupt the record layout
(``\\x1f`` separates its fields). Failures raise :class:`InvalidRequest` with
per-field messages, like the API's 400.
"""

from __future__ import annotations

import re
from typing import Any

from token_service.errors import InvalidRequest, TokenInvalid
from token_service.records import dump_json
from token_service.tokens import is_well_formed

# Kept in step with token_service/schemas.py (which needs marshmallow, a server-only dependency).
SCOPE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}\Z")
_NO_CONTROL = re.compile(r"[^\x00-\x1f\x7f]*\Z")


def scope(value: Any) -> str:
    if not isinstance(value, str) or not SCOPE_RE.match(value):
        raise InvalidRequest(
            "The request does not match the schema.",
            {"scope": ["1-64 chars of A-Za-z0-9._:- starting with a letter or digit"]},
        )
    return value


def text(name: str, value: Any, max_chars: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= max_chars or not _NO_CONTROL.match(value):
        raise InvalidRequest(
            "The request does not match the schema.",
            {name: [f"1-{max_chars} characters, no control characters"]},
        )
    return value


def bounded(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRequest(
            "The request does not match the schema.", {name: [f"Must be between {low} and {high}."]}
        )
    return value


def token(value: Any) -> str:
    # malformed is answered like unknown, as the API does
    if not isinstance(value, str) or not is_well_formed(value):
        raise TokenInvalid("The token is unknown, expired or revoked.")
    return value


def payload(name: str, value: Any, max_bytes: int) -> Any:
    try:
        size = len(dump_json(value))
    except (TypeError, ValueError):
        raise InvalidRequest(f"The {name} is not JSON.", {name: ["Must be JSON-serializable."]}) from None
    if size > max_bytes:
        raise InvalidRequest(
            f"The {name} is too large to store.", {name: [f"At most {max_bytes} bytes of JSON."]}
        )
    return value
