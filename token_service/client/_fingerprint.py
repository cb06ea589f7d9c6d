"""One fingerprint function: what makes two requests "the same request".

Every guard of the SDK uses it (the Idempotency-Key middlewares, ``@require_token``'s
``fingerprint=``, the framework integrations, the durable backstop): the SHA-256 (hex) of the
canonical JSON of its parts, so the same values give one fingerprint in any process. A body
counts by what it means: a JSON body by its parsed value, chosen ``fields`` of a JSON or form
body by their values, any other body by its bytes, or what a callable returns for the
:class:`RequestFacts` (docs/integrations/wsgi-middleware.md, "What makes two requests the same").
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


def _is_json_type(content_type: str | None) -> bool:
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
    if _is_json_type(content_type):
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


def _with_body(parts: tuple[Any, ...], body: bytes, content_type: str | None, fields: Any) -> str:
    """The fingerprint of ``parts`` and what the body means. A document the parser took but the
    encoder cannot walk back (nested nearly as deep as the interpreter allows) counts by its
    bytes: it raises nothing (it was a 500 from every decorator) and matches only those bytes."""
    try:
        return fingerprint(*parts, body_identity(body, content_type, fields))
    except RecursionError:
        return fingerprint(*parts, _by_bytes(body))


def body_fingerprint(body: bytes, content_type: str | None, fields: Sequence[str] | None = None) -> str:
    """The fingerprint of what a body means (``fields``: of those fields only), as the
    ``@require_token`` decorators compute it for ``fingerprint=[names]``."""
    return _with_body((), body, content_type, fields)


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
    return _with_body((method.upper(), path, query), body, content_type, fields)


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
