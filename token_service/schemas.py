"""Request bodies of the HTTP API, as marshmallow schemas.

Unknown fields are rejected (marshmallow's default ``RAISE``); types are
strict — ``"5"`` and ``true`` are not integers and ``1`` is not a boolean — so what a
client meant is never guessed. Limits that come from configuration (maximum
TTL and lease) are passed to the schema when the app builds it.
"""

from __future__ import annotations

import re
from typing import Any

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

SCOPE_RE = r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}\Z"
# Subjects, fingerprints and request ids are opaque text, but never control
# characters: the Redis record uses \x1f as its field separator.
_NO_CONTROL = re.compile(r"[^\x00-\x1f\x7f]*\Z")


def _text(max_chars: int, **kwargs: Any) -> fields.String:
    return fields.String(
        validate=[
            validate.Length(min=1, max=max_chars),
            validate.Regexp(_NO_CONTROL, error="must not contain control characters"),
        ],
        **kwargs,
    )


class StrictBoolean(fields.Boolean):
    """Only JSON true/false: marshmallow's Boolean would also take 1, "yes" and "on"."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> bool:
        if not isinstance(value, bool):
            raise self.make_error("invalid")
        return value


class JsonInteger(fields.Integer):
    """A JSON number with no fractional part: ``5`` and ``5.0`` (the same JSON number, and an
    ``integer`` to JSON Schema, hence to openapi.yaml), never ``"5"``, ``5.5`` or ``true``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(strict=True, **kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.make_error("invalid")
        if isinstance(value, float) and not value.is_integer():
            raise self.make_error("invalid")
        return int(value)


class _Bounded(Schema):
    """A schema whose integer limits come from configuration."""

    def __init__(self, *, limits: dict[str, tuple[int, int]] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.limits = limits or {}

    @validates_schema
    def _check_limits(self, data: dict[str, Any], **kwargs: Any) -> None:
        errors = {}
        for name, (low, high) in self.limits.items():
            value = data.get(name)
            if value is not None and not low <= value <= high:
                errors[name] = [f"Must be between {low} and {high}."]
        if errors:
            raise ValidationError(errors)


class GenerateSchema(_Bounded):
    scope = fields.String(
        required=True,
        validate=validate.Regexp(
            SCOPE_RE, error="1-64 chars of A-Za-z0-9._:- starting with a letter or digit"
        ),
    )
    subject = _text(128, load_default=None, allow_none=True)
    ttl_seconds = JsonInteger(load_default=None, allow_none=True)
    fingerprint = _text(128, load_default=None, allow_none=True)


class GenerateBatchSchema(GenerateSchema):
    count = JsonInteger(required=True, validate=validate.Range(1, 1000))


class _TokenBody(Schema):
    # Any string: a malformed token is answered 404 token_invalid, like an unknown one.
    token = fields.String(required=True)


class ConsumeSchema(_TokenBody):
    scope = fields.String(
        required=True,
        validate=validate.Regexp(
            SCOPE_RE, error="1-64 chars of A-Za-z0-9._:- starting with a letter or digit"
        ),
    )
    subject = _text(128, load_default=None, allow_none=True)
    fingerprint = _text(128, load_default=None, allow_none=True)
    request_id = _text(128, load_default=None, allow_none=True)


class BeginSchema(ConsumeSchema, _Bounded):
    lease_seconds = JsonInteger(load_default=None, allow_none=True)


class CompleteSchema(_TokenBody):
    lease_id = _text(64, required=True)
    result = fields.Raw(load_default=None, allow_none=True)


class FailSchema(_TokenBody):
    lease_id = _text(64, required=True)
    retryable = StrictBoolean(required=True)
    error = fields.Raw(load_default=None, allow_none=True)


class TokenOnlySchema(_TokenBody):
    pass
