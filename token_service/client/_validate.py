"""Argument checks for the direct transport, the same rules the HTTP API's schemas apply.

Over HTTP the service validates; straight against Redis nobody else would,
and a control character in a subject would corrupt the record layout
(``\\x1f`` separates its fields). Failures raise :class:`InvalidRequest` with
per-field messages, like the API's 400.
"""

from __future__ import annotations

from typing import Any

from token_service.errors import InvalidRequest, TokenInvalid
from token_service.records import check_payload
from token_service.tokens import NO_CONTROL_RE, SCOPE_RE, SCOPE_RULE, is_well_formed


def scope(value: Any) -> str:
    if not isinstance(value, str) or not SCOPE_RE.match(value):
        raise InvalidRequest(
            "The request does not match the schema.",
            {"scope": [SCOPE_RULE]},
        )
    return value


def text(name: str, value: Any, max_chars: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= max_chars or not NO_CONTROL_RE.match(value):
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
    check_payload(name, value, max_bytes)
    return value
