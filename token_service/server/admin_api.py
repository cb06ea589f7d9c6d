"""The admin HTTP routes (``/admin/…``): the operators' tools of :mod:`token_service.ops.admin`.

They answer only to a key of ``TOKEN_SERVICE_ADMIN_KEYS`` (``Authorization:
Bearer <admin key>``), a list of its own: a service key opens none of them,
and an admin key opens none of the backend routes (the configuration refuses
a key in both lists). With no admin key configured every admin route answers
401. The audit line of each action names the key by the first 12 hex digits
of its SHA-256, never the key.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from flask import Blueprint, Response, g, request

from token_service.config import Settings
from token_service.errors import InvalidRequest, Unauthorized
from token_service.ops.admin import KINDS, STATES, Admin, Filter, audit, shown_ref
from token_service.server.api import json_body
from token_service.server.auth import check_service_key
from token_service.server.responses import json_response
from token_service.tokens import is_plain_text, whole_number

__all__ = ["MAX_IDENTITY_CHARS", "make_blueprint"]

MAX_IDENTITY_CHARS = 4096
# the admin routes' endpoints and the action their audit lines name
_ACTIONS = {
    "admin.list_records": "list",
    "admin.show": "show",
    "admin.revoke": "revoke",
    "admin.release": "release",
    "admin.idempotency_lookup": "show_idempotency",
}
# answers given before any record was looked at (the actions audit every later outcome)
_REFUSED = frozenset({400, 401, 408, 413, 415})
_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9!#$%&'*+.^_`|~-]{0,19}\Z")


def _admin_actor(settings: Settings) -> str:
    header = request.headers.get("Authorization")
    if not settings.admin_keys:
        raise Unauthorized("The admin API is off: no TOKEN_SERVICE_ADMIN_KEYS are configured.")
    try:
        check_service_key(settings.admin_keys, header)
    except Unauthorized:
        raise Unauthorized("An admin key is required: Authorization: Bearer <admin key>.") from None
    g.admin_actor = "admin-key:" + _key_digest(header or "")
    return str(g.admin_actor)


def _key_digest(header: str) -> str:
    presented = header.partition(" ")[2].strip()
    return hashlib.sha256(presented.encode("utf-8", "surrogateescape")).hexdigest()[:12]


def _refused_actor() -> str:
    """Who was refused, never their credentials: a Bearer key by its digest (as the audit lines
    name an admin key), another scheme by its name only (a digest of a weak password is guessable)."""
    header = request.headers.get("Authorization")
    if header is None:
        return "anonymous"
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return "key:" + _key_digest(header)
    return (scheme.lower() if _SCHEME_RE.match(scheme) else "malformed") + "-credentials"


def _audit_refusal(response: Response) -> Response:
    """One audit line for an admin call refused before it reached a record (401, 400, 413, 415, ...).

    The actions write their own lines from the record on (found, not found, not in progress).
    """
    if response.status_code not in _REFUSED or request.endpoint not in _ACTIONS:
        return response
    problem = response.get_json(silent=True) if response.is_json else None
    code = problem.get("code") if isinstance(problem, dict) else None
    errors = problem.get("errors") if isinstance(problem, dict) else None
    fields = sorted(str(name)[:64] for name in errors)[:10] if isinstance(errors, dict) else None
    audit(
        g.get("admin_actor") or _refused_actor(),
        _ACTIONS[request.endpoint],
        shown_ref((request.view_args or {}).get("ref")),
        "refused",
        status=response.status_code,
        code=code if isinstance(code, str) else None,
        fields=fields or None,
    )
    return response


def _choice(name: str, allowed: Any) -> str | None:
    value = request.args.get(name)
    if value is not None and value not in allowed:
        raise InvalidRequest(f"Unknown {name}.", {name: [f"One of {', '.join(sorted(allowed))}."]})
    return value


def _number(name: str, default: int, high: int) -> int:
    raw = request.args.get(name)
    if raw is None:
        return default
    number = whole_number(raw, max_digits=9)  # not int(): "²" or 5000 digits were a 500
    if number is None or not 1 <= number <= high:
        raise InvalidRequest(f"Bad {name}.", {name: [f"A whole number from 1 to {high}."]})
    return number


def _text(name: str, limit: int = 128) -> str | None:
    value = request.args.get(name)
    if value is not None and (not value or len(value) > limit or not value.isprintable()):
        raise InvalidRequest(f"Bad {name}.", {name: [f"1-{limit} printable characters."]})
    return value


def _flag(name: str) -> bool | None:
    value = _choice(name, {"true", "false"})
    return None if value is None else value == "true"


def make_blueprint(settings: Settings, client: Any) -> Blueprint:
    bp = Blueprint("admin", __name__)
    bp.after_request(_audit_refusal)

    def admin() -> Admin:
        return Admin(
            client,
            key_prefix=settings.key_prefix,
            result_ttl_seconds=settings.result_ttl_seconds,
            actor=_admin_actor(settings),
        )

    @bp.get("/admin/records")
    def list_records() -> Response:
        acting = admin()
        prefix = _text("ref_prefix", 22)
        wanted = Filter(
            kind=_choice("kind", KINDS),
            state=_choice("state", STATES),
            scope=_text("scope", 64),
            request_id=_text("request_id"),
            ref_prefix=prefix,
            lease_expired=_flag("lease_expired"),
        )
        cursor, count, limit = (
            request.args.get("cursor", "0"),
            _number("count", 1000, 10000),
            _number("limit", 100, 1000),
        )
        if prefix is not None:
            page = acting.find_by_ref_prefix(prefix, cursor, count, limit, wanted)
        else:
            page = acting.list(wanted, cursor, count, limit)
        return json_response(
            {
                "records": [record.to_dict() for record in page.records],
                "cursor": page.cursor,
                "done": page.done,
                "scanned": page.scanned,
            }
        )

    @bp.get("/admin/records/<ref>")
    def show(ref: str) -> Response:
        return json_response(admin().show(ref, _choice("kind", KINDS)).to_dict())

    @bp.post("/admin/records/<ref>/revoke")
    def revoke(ref: str) -> Response:
        record = admin().revoke(ref, _choice("kind", KINDS))
        return json_response(
            {"outcome": "revoked", "kind": record.kind, "ref": record.ref, "was": record.state}
        )

    @bp.post("/admin/records/<ref>/release")
    def release(ref: str) -> Response:
        outcome = admin().release(ref, _choice("kind", KINDS))
        return json_response({"outcome": outcome, "ref": ref})

    @bp.post("/admin/idempotency/lookup")
    def idempotency_lookup() -> Response:
        # a POST: the client identity (often its credentials) never goes into a URL or a log
        acting = admin()
        body = json_body()  # Content-Type: application/json, as every JSON route (text/plain was taken)
        identity, key = body.get("identity"), body.get("idempotency_key")
        errors = {}
        # no control characters or lone surrogates: "\ud800" cannot even be hashed (was a 500)
        if (
            not isinstance(identity, str)
            or not 1 <= len(identity) <= MAX_IDENTITY_CHARS
            or not is_plain_text(identity)
        ):
            errors["identity"] = [
                f"1-{MAX_IDENTITY_CHARS} characters, no control characters: "
                "what the middleware's identity() returned."
            ]
        if not isinstance(key, str) or not 1 <= len(key) <= 255 or not is_plain_text(key):
            errors["idempotency_key"] = [
                "1-255 characters, no control characters: the Idempotency-Key without its quotes."
            ]
        if set(body) - {"identity", "idempotency_key"}:
            errors["body"] = ["Only identity and idempotency_key."]
        if errors:
            raise InvalidRequest("The request does not match the schema.", errors)
        return json_response(acting.show_idempotency(identity, key).to_dict())  # type: ignore[arg-type]

    return bp
