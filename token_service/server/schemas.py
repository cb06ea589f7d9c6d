"""Request bodies of the HTTP API, as marshmallow schemas.

Unknown fields are rejected (marshmallow's default ``RAISE``); types are
strict — ``"5"`` and ``true`` are not integers and ``1`` is not a boolean — so what a
client meant is never guessed. Limits that come from configuration (maximum
TTL and lease) are passed to the schema when the app builds it.
"""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from token_service import defaults

# the field rules are shared with the SDK's direct transport, which has no marshmallow
from token_service.tokens import NO_CONTROL_RE, SCOPE_RE, SCOPE_RULE

__all__ = [
    "BeginSchema",
    "BodySchema",
    "CompleteSchema",
    "ConsumeSchema",
    "FailSchema",
    "GenerateBatchSchema",
    "GenerateSchema",
    "JsonInteger",
    "RenewSchema",
    "StrictBoolean",
    "TokenOnlySchema",
]


def _text(max_chars: int, **kwargs: Any) -> fields.String:
    return fields.String(
        validate=[
            validate.Length(min=1, max=max_chars),
            validate.Regexp(NO_CONTROL_RE, error="must not contain control characters"),
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


class BodySchema(Schema):
    """A request body schema, with an optional fast path for the hot routes.

    ``fast_load`` answers the common case -- a valid body -- without
    marshmallow's machinery (a tenth of its cost) and returns exactly what
    ``load`` would; whenever it is not sure, it returns None and ``load``
    decides, with marshmallow's error messages. It may accept less than
    ``load``, never more (tests/perf/test_fast_load.py checks this).
    """

    def fast_load(self, body: dict[str, Any]) -> dict[str, Any] | None:
        return None


def _fast_text(value: Any, max_chars: int) -> bool:
    return value is None or (
        type(value) is str and 1 <= len(value) <= max_chars and NO_CONTROL_RE.match(value) is not None
    )


def _fast_int(value: Any, low: int, high: int) -> bool:
    return value is None or (type(value) is int and low <= value <= high)


class _Bounded(BodySchema):
    """A schema whose integer limits come from configuration."""

    def __init__(self, *, limits: dict[str, tuple[int, int]] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.limits = limits or {}

    # skip_on_field_errors=False: a bad ttl_seconds is reported beside a bad scope, not only
    # once the scope is fixed (``data`` holds the fields that loaded; the others have their error)
    @validates_schema(skip_on_field_errors=False)
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
        validate=validate.Regexp(SCOPE_RE, error=SCOPE_RULE),
    )
    subject = _text(128, load_default=None, allow_none=True)
    ttl_seconds = JsonInteger(load_default=None, allow_none=True)
    fingerprint = _text(128, load_default=None, allow_none=True)

    _FIELDS = frozenset(("scope", "subject", "ttl_seconds", "fingerprint"))

    def fast_load(self, body: dict[str, Any]) -> dict[str, Any] | None:
        if not body.keys() <= self._FIELDS:
            return None
        scope, ttl_seconds = body.get("scope"), body.get("ttl_seconds")
        low, high = self.limits.get("ttl_seconds", (1, 1))
        if (
            type(scope) is str
            and SCOPE_RE.match(scope)
            and _fast_text(body.get("subject"), 128)
            and _fast_text(body.get("fingerprint"), 128)
            and _fast_int(ttl_seconds, low, high)
        ):
            return {
                "scope": scope,
                "subject": body.get("subject"),
                "ttl_seconds": ttl_seconds,
                "fingerprint": body.get("fingerprint"),
            }
        return None


class GenerateBatchSchema(GenerateSchema):
    count = JsonInteger(required=True, validate=validate.Range(1, defaults.MAX_BATCH))

    _FIELDS = GenerateSchema._FIELDS | {"count"}

    def fast_load(self, body: dict[str, Any]) -> dict[str, Any] | None:
        count = body.get("count")
        if type(count) is not int or not 1 <= count <= defaults.MAX_BATCH:
            return None
        data = super().fast_load(body)
        if data is not None:
            data["count"] = count
        return data


class _TokenBody(BodySchema):
    # Any string: a malformed token is answered 404 token_invalid, like an unknown one.
    token = fields.String(required=True)


class ConsumeSchema(_TokenBody):
    scope = fields.String(
        required=True,
        validate=validate.Regexp(SCOPE_RE, error=SCOPE_RULE),
    )
    subject = _text(128, load_default=None, allow_none=True)
    fingerprint = _text(128, load_default=None, allow_none=True)
    request_id = _text(128, load_default=None, allow_none=True)

    _FIELDS = frozenset(("token", "scope", "subject", "fingerprint", "request_id"))

    def fast_load(self, body: dict[str, Any]) -> dict[str, Any] | None:
        if not body.keys() <= self._FIELDS:
            return None
        token, scope = body.get("token"), body.get("scope")
        if (
            type(token) is str
            and type(scope) is str
            and SCOPE_RE.match(scope)
            and _fast_text(body.get("subject"), 128)
            and _fast_text(body.get("fingerprint"), 128)
            and _fast_text(body.get("request_id"), 128)
        ):
            return {
                "token": token,
                "scope": scope,
                "subject": body.get("subject"),
                "fingerprint": body.get("fingerprint"),
                "request_id": body.get("request_id"),
            }
        return None


class BeginSchema(ConsumeSchema, _Bounded):
    lease_seconds = JsonInteger(load_default=None, allow_none=True)

    def fast_load(self, body: dict[str, Any]) -> dict[str, Any] | None:
        return None  # not a hot route: marshmallow decides


class CompleteSchema(_TokenBody):
    lease_id = _text(64, required=True)
    result = fields.Raw(load_default=None, allow_none=True)


class RenewSchema(_TokenBody, _Bounded):
    lease_id = _text(64, required=True)
    lease_seconds = JsonInteger(load_default=None, allow_none=True)


class FailSchema(_TokenBody):
    lease_id = _text(64, required=True)
    retryable = StrictBoolean(required=True)
    error = fields.Raw(load_default=None, allow_none=True)


class TokenOnlySchema(_TokenBody):
    pass
