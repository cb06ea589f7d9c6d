"""One fingerprint function: what makes two requests "the same request".

Everything in the SDK that compares requests uses it: the ``Idempotency-Key``
middlewares (WSGI and ASGI), ``@require_token``'s ``fingerprint`` option, the
framework integrations and the durable backstop. A fingerprint is the SHA-256
(hex, 64 characters) of the canonical JSON of its parts: keys sorted, no
whitespace, ASCII only. So ``{"a": 1, "b": 2}`` and ``{"b":2,"a":1}`` give one
fingerprint, and so do the same values computed in two processes.

For HTTP requests the body counts by what it means, not by its bytes:

- a JSON body (``application/json``, ``*/*+json``) counts by its parsed value
  (key order and whitespace do not matter; a body that does not parse counts
  by its bytes);
- ``fields=("amount", "currency")`` counts only those fields of a JSON or
  form (``application/x-www-form-urlencoded``) body; a dotted name reaches
  into nested objects (``"order.amount"``); a missing field counts as missing;
- any other body counts by its bytes (their SHA-256);
- or pass a callable: given the :class:`RequestFacts`, it returns any
  JSON-able value, and that value is the fingerprint's input.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

__all__ = [
    "FingerprintSpec",
    "RequestFacts",
    "body_fingerprint",
    "body_identity",
    "fields_fingerprint",
    "fingerprint",
    "fingerprint_request",
    "http_fingerprint",
    "is_json_type",
]

_MISSING = {"missing": True}


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, ASCII: one text per value. Non-JSON values count by ``str()``."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=True, default=str).encode(
        "ascii"
    )


def fingerprint(*parts: Any) -> str:
    """SHA-256 (hex) of the canonical JSON of ``parts``: the same values give the same fingerprint.

    The durable backstop's ``request_fingerprint`` is this function (records it
    stored before keep matching).
    """
    return hashlib.sha256(canonical_json(parts)).hexdigest()


def is_json_type(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _is_form_type(content_type: str | None) -> bool:
    return (content_type or "").split(";", 1)[0].strip().lower() == "application/x-www-form-urlencoded"


def _pick(document: Any, name: str) -> Any:
    value = document
    for step in name.split("."):
        if not isinstance(value, Mapping) or step not in value:
            return _MISSING
        value = value[step]
    return value


def body_identity(body: bytes, content_type: str | None, fields: Sequence[str] | None = None) -> Any:
    """What a request body means, as a JSON-able value (see the module docs)."""
    document: Any = _MISSING
    if is_json_type(content_type):
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):
            document = _MISSING  # not JSON after all: counts by its bytes
    elif fields is not None and _is_form_type(content_type):
        try:
            form = parse_qs(body.decode("utf-8"), keep_blank_values=True)
        except UnicodeDecodeError:
            form = None
        if form is not None:
            document = {name: values[0] if len(values) == 1 else values for name, values in form.items()}
    if document is _MISSING:
        return _by_bytes(body)
    if fields is not None:
        return {"fields": {name: _pick(document, name) for name in fields}}
    return {"json": document}


def _by_bytes(body: bytes) -> dict[str, str]:
    return {"sha256": hashlib.sha256(body).hexdigest()}


def body_fingerprint(body: bytes, content_type: str | None, fields: Sequence[str] | None = None) -> str:
    """The fingerprint of what a body means (``fields``: of those fields only), as the
    ``@require_token`` decorators compute it for ``fingerprint=[names]``.

    A document the parser took but the encoder cannot walk back (nested nearly as
    deep as the interpreter allows, so parsing fits and encoding one level deeper
    does not) counts by its bytes: it raises nothing (it was a 500 from every
    decorator), and it can only match a fingerprint issued for those bytes.
    """
    try:
        return fingerprint(body_identity(body, content_type, fields))
    except RecursionError:
        return fingerprint(_by_bytes(body))


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """The parts of an HTTP request a fingerprint may use, whatever the framework."""

    method: str
    path: str
    query: str = ""
    body: bytes = b""
    content_type: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names


FingerprintSpec = Sequence[str] | Callable[[RequestFacts], Any] | None


def http_fingerprint(
    method: str,
    path: str,
    query: str = "",
    body: bytes = b"",
    content_type: str | None = None,
    *,
    fields: Sequence[str] | None = None,
) -> str:
    """The fingerprint of an HTTP request: method, path, query string and what its body means."""
    try:
        return fingerprint(method.upper(), path, query, body_identity(body, content_type, fields))
    except RecursionError:
        # a document nested deeper than the interpreter can walk here: it counts by its bytes
        return fingerprint(method.upper(), path, query, _by_bytes(body))


def fields_fingerprint(values: Mapping[str, Any]) -> str:
    """The fingerprint of chosen body fields, as ``@require_token(fingerprint=[names])`` computes it.

    Issue the token with ``fields_fingerprint({"amount": 100, "currency": "EUR"})``
    and a request whose JSON (or form) body has those values passes.
    """
    return fingerprint({"fields": dict(values)})


def fingerprint_request(facts: RequestFacts, spec: FingerprintSpec = None) -> str:
    """``spec``: None, the whole request; field names, the request with only those body fields;
    a callable, the value it returns for the request."""
    if callable(spec):
        return fingerprint(spec(facts))
    if isinstance(spec, str):
        raise TypeError("fields must be a sequence of names, not one string")
    return http_fingerprint(
        facts.method, facts.path, facts.query, facts.body, facts.content_type, fields=spec
    )
