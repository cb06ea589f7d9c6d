"""Argument checks for the direct transport, the same rules the HTTP API's schemas apply.

Over HTTP the service validates; straight against Redis nobody else would,
and a control character in a subject would corrupt the record layout
(``\\x1f`` separates its fields). Failures raise :class:`InvalidRequest` with
per-field messages, like the API's 400.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from token_service.errors import InvalidRequest, TokenInvalid
from token_service.tokens import SCOPE_RE, SCOPE_RULE, is_plain_text, is_well_formed

__all__ = ["bounded", "every", "operation", "scope", "text", "token"]

# Scopes already found valid: an application uses a handful, on every call. Bounded, so
# a caller inventing scopes cannot grow it; only exact str values are remembered (a str
# subclass could compare equal to a valid scope and still not be one).
_VALID_SCOPES: set[str] = set()
_MAX_VALID_SCOPES = 256
# a keyed operation's record name (``keyed.operation_token``): never a well-formed token
_OPERATION_RE = re.compile(r"op:[A-Za-z0-9_-]{43}\Z")


def _refused(name: str, rule: str) -> InvalidRequest:
    return InvalidRequest("The request does not match the schema.", {name: [rule]})


def scope(value: Any) -> str:
    if type(value) is str and value in _VALID_SCOPES:
        return value
    if not isinstance(value, str) or not SCOPE_RE.match(value):
        raise _refused("scope", SCOPE_RULE)
    if type(value) is str and len(_VALID_SCOPES) < _MAX_VALID_SCOPES:
        _VALID_SCOPES.add(value)
    return value


def text(name: str, value: Any, max_chars: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= max_chars or not is_plain_text(value):
        raise _refused(name, f"1-{max_chars} characters, no control characters")
    return value


def every(*checks: Callable[[], object]) -> None:
    """Run every check and raise one InvalidRequest naming every field that fails, as the API's
    400 does (called once a first check has failed: the usual path stops at the first)."""
    errors: dict[str, Any] = {}
    for run in checks:
        try:
            run()
        except InvalidRequest as exc:
            errors.update(exc.errors)
    if errors:
        raise InvalidRequest("The request does not match the schema.", errors)


def bounded(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _refused(name, f"Must be between {low} and {high}.")
    return value


def token(value: Any) -> str:
    # malformed is answered like unknown, as the API does
    if not isinstance(value, str) or not is_well_formed(value):
        raise TokenInvalid("The token is unknown, expired or revoked.")
    return value


def operation(value: Any) -> str:
    if not isinstance(value, str) or not _OPERATION_RE.match(value):
        raise TokenInvalid("Not a keyed operation's record.")
    return value
