"""The work behind the token routes, from a parsed body to the reply document, without Flask.

The Flask views (:mod:`token_service.server.api`) and the lean WSGI path of
the two hottest routes (:mod:`token_service.server.hot_path`) both call
:class:`HotOperations` and parse and check bodies with these functions, so the
two paths cannot drift apart in what they check, store or answer; neither
imports the other. tests/test_layout.py holds this module and hot_path.py
free of Flask.
"""

from __future__ import annotations

import json
import math
import time
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, NoReturn

from marshmallow import Schema, ValidationError

from token_service.config import Settings
from token_service.errors import InvalidRequest, TokenInvalid
from token_service.limits import Budget, IssuanceLimits, MemoryReserve, address_group, client_key
from token_service.records import IssueRequest, UseRequest
from token_service.server.schemas import BodySchema, ConsumeSchema, GenerateSchema
from token_service.store import TokenStore
from token_service.tokens import NO_CONTROL_RE, is_well_formed

__all__ = [
    "HotOperations",
    "load_body",
    "parse_json_object",
    "raise_request_id_required",
    "rfc3339",
    "well_formed_token",
]


def rfc3339(epoch_seconds: float) -> str:
    """The time as RFC 3339 text in UTC, to the second (``2026-12-07T15:30:00Z``)."""
    # the second datetime.fromtimestamp lands on: it rounds to the microsecond (half to even) first
    second = math.floor(epoch_seconds)
    if round((epoch_seconds - second) * 1e6) >= 1_000_000:
        second += 1
    return _second_text(second)


# Every generate writes the time its token expires: within a second, for each TTL, the same text.
@lru_cache(maxsize=256)
def _second_text(second: int) -> str:
    return datetime.fromtimestamp(second, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be one JSON object (any UTF encoding), or InvalidRequest."""
    try:
        # json.loads(raw, parse_constant=..., parse_float=...) without a new decoder per request
        body = _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequest("The body is not valid JSON.", {"body": ["Malformed JSON."]}) from None
    except RecursionError:  # [[[[...: nested deeper than Python's parser goes, within the size limit
        raise InvalidRequest("The body is nested too deeply.", {"body": ["Nested too deeply."]}) from None
    if not isinstance(body, dict):
        raise InvalidRequest("The body must be a JSON object.", {"body": ["Not an object."]})
    return body


def _reject_constant(name: str) -> Any:
    # NaN and Infinity are not JSON: stored, they would make later replies invalid JSON
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400 is valid JSON but no float: refuse rather than store Infinity
        raise ValueError("number out of range")
    return value


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


def raise_request_id_required() -> NoReturn:
    """TOKEN_SERVICE_REQUIRE_REQUEST_ID: a consume or begin that could not be retried safely."""
    raise InvalidRequest(
        "A request_id is required: without one, a retry after a lost reply cannot tell a win from a loss.",
        {"request_id": ["Required (TOKEN_SERVICE_REQUIRE_REQUEST_ID is on); reuse it when you retry."]},
    )


def load_body(schema: Schema, body: dict[str, Any]) -> dict[str, Any]:
    fast = schema.fast_load(body) if isinstance(schema, BodySchema) else None
    if fast is not None:
        return fast
    try:
        return schema.load(body)  # type: ignore[no-any-return]
    except ValidationError as exc:
        errors = exc.messages if isinstance(exc.messages, dict) else {"body": exc.messages}
        raise InvalidRequest("The request does not match the schema.", errors) from None


def _gateway_subject(header: str, value: str | None) -> str | None:
    """The subject the gateway vouches for; held to the body's rules (it lands in the record)."""
    subject = value or None
    if subject is not None and (len(subject) > 128 or not NO_CONTROL_RE.match(subject)):
        raise InvalidRequest(
            f"The {header} header is not a valid subject.",
            {header: ["1-128 characters, no control characters."]},
        )
    return subject


def well_formed_token(data: dict[str, Any]) -> str:
    token: str = data["token"]
    if not is_well_formed(token):
        raise TokenInvalid("The token is unknown, expired or revoked.")
    return token


# A client's limit record, worked out once per client rather than on every generate (a digest:
# 12.5 k instructions a request); the clients seen last, at most this many, are remembered.
_CLIENTS_REMEMBERED = 4096
_client_key = lru_cache(maxsize=_CLIENTS_REMEMBERED)(client_key)


@lru_cache(maxsize=_CLIENTS_REMEMBERED)
def _address_key(key_prefix: str, address: str | None, ipv4_prefix: int, ipv6_prefix: int) -> str:
    """The limit record of the client at ``address``: its network's (limits.address_group)."""
    return client_key(key_prefix, f"addr:{address_group(address, ipv4_prefix, ipv6_prefix)}")


class HotOperations:
    """The work of the two hottest routes, from a parsed body to the reply document, without Flask.

    The Flask views of :mod:`token_service.server.api` and
    :mod:`token_service.server.hot_path` (which answers these routes without
    Flask's request machinery) both call these, so the two paths cannot drift
    apart in what they check, store or answer.
    """

    def __init__(self, settings: Settings, store: TokenStore) -> None:
        self.settings = settings
        self.store = store
        self.ttl_limits = {"ttl_seconds": (1, settings.max_ttl_seconds)}
        self.generate_schema = GenerateSchema(limits=self.ttl_limits)
        self.consume_schema = ConsumeSchema()
        budget = Budget(
            settings.anonymous_max_outstanding,
            settings.anonymous_max_outstanding_bytes,
            settings.anonymous_max_memory_percent,
        )
        self.limits = IssuanceLimits(settings.rate_limit, settings.max_outstanding_per_subject, budget)
        # Redis's memory, read at most once a second by this process, lowers the budget's byte
        # limit (not on the embedded store: it has no maxmemory, and no INFO)
        self.reserve = (
            MemoryReserve(store.memory_reading, settings.anonymous_max_memory_percent)
            if settings.anonymous_max_memory_percent and not settings.embedded
            else None
        )

    def issue(
        self, data: dict[str, Any], count: int, gateway_subject: str | None, remote_addr: str | None
    ) -> tuple[list[str], dict[str, Any]]:
        """The tokens, and the fields every one of them shares in the reply.

        ``gateway_subject`` is the value of the configured subject header (if
        any), ``remote_addr`` the client's address (after any trusted proxies).
        """
        settings = self.settings
        subject = data["subject"]
        if settings.subject_header:
            # Only a trusted gateway may say whose token it is.
            if subject is not None:
                raise InvalidRequest(
                    "The subject is set by the gateway, not the body.",
                    {"subject": [f"Not allowed: the subject comes from {settings.subject_header}."]},
                )
            subject = _gateway_subject(settings.subject_header, gateway_subject)
        ttl_seconds = data["ttl_seconds"] or settings.default_ttl_seconds
        issue_request = IssueRequest(data["scope"], subject, data["fingerprint"], ttl_seconds)
        if self.limits.enabled:
            # The trusted subject if the gateway set one, else the client address:
            # a body subject is the client's own claim and names nobody.
            trusted = settings.subject_header and subject is not None
            if trusted:
                key = _client_key(settings.key_prefix, f"subject:{subject}")
            else:
                key = _address_key(
                    settings.key_prefix, remote_addr, settings.client_ipv4_prefix, settings.client_ipv6_prefix
                )
            tokens = self.store.admit_and_issue(key, self.limits, issue_request, count, self._byte_limit())
        else:
            tokens = self.store.issue(issue_request, count)
        shared = {
            "scope": issue_request.scope,
            "subject": subject,
            "fingerprint": issue_request.fingerprint,
            "ttl_seconds": ttl_seconds,
            "expires_at": rfc3339(time.time() + ttl_seconds),
        }
        return tokens, shared

    def _byte_limit(self) -> int | None:
        """The budget's byte limit for this call: the configured one, or less near maxmemory."""
        if self.reserve is None:
            return None
        allowance = self.reserve.byte_limit()
        configured = self.limits.budget.max_bytes
        if allowance is None or (configured and configured <= allowance):
            return None
        return max(allowance, 1)  # 0 would mean "no limit": nothing is free

    def generate(
        self, body: dict[str, Any], gateway_subject: str | None, remote_addr: str | None
    ) -> dict[str, Any]:
        tokens, shared = self.issue(load_body(self.generate_schema, body), 1, gateway_subject, remote_addr)
        return {"token": tokens[0], **shared}

    def use_request(self, data: dict[str, Any]) -> UseRequest:
        """The use of a token a consume or begin body asks for: a well-formed token, and a
        request_id if the settings require one."""
        if data["request_id"] is None and self.settings.require_request_id:
            raise_request_id_required()
        return UseRequest(
            well_formed_token(data), data["scope"], data["subject"], data["fingerprint"], data["request_id"]
        )

    def consume(self, body: dict[str, Any]) -> dict[str, Any]:
        outcome = self.store.consume(self.use_request(load_body(self.consume_schema, body)))
        return {"outcome": "consumed", "replayed": outcome.replayed}
