"""What the token service may answer to each operation, and how the SDK reads it (no I/O).

``openapi.yaml`` is the contract, and the HTTP transport reads only what it allows: the
operation's statuses (:data:`OPERATIONS`, held to openapi.yaml by tests/client/test_replies.py),
their media types, no content coding, at most :func:`cap_bytes` of body, the documented shape.
Anything else is :class:`UnexpectedReply`, never retried; 408/502/503/504 from anyone, and the
service's ``500 internal_error``, are :class:`ServiceUnavailable` (docs/sdk.md, "Replies that
are not the service's"). No message repeats anything the reply said.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from token_service import defaults
from token_service.errors import (
    ERRORS_BY_CODE,
    InvalidRequest,
    ServiceUnavailable,
    TokenError,
    UnexpectedReply,
)
from token_service.records import Completed, Consumed, FailRecorded, Finished, Renewed, Started
from token_service.tokens import whole_number

from ._types import IssuedToken, TokenInfo

__all__ = ["OPERATIONS", "Reading", "cap_bytes", "problem_error"]

JSON = "application/json"
PROBLEM_JSON = "application/problem+json"

# Answers that mean "no answer came", whatever the operation and whoever sent them: the
# request did not arrive in time (408), or a proxy found no service behind it (502, 504)
# or the service found no Redis (503). Nothing is known to have happened: retried.
TRANSIENT_STATUSES = frozenset({408, 502, 503, 504})

# Every operation's error statuses but its own (openapi.yaml): gunicorn's and the hot
# path's refusals of a request they cannot read, a method the path does not take (405:
# never the SDK's POST to the service's own routes), and the safety net (500).
_UNREADABLE = frozenset({400, 413, 414, 417, 431, 501})
_EVERY_OPERATION = _UNREADABLE | {405, 500}
_TOKEN_OPS = _EVERY_OPERATION | {401, 404, 408, 503}


@dataclass(frozen=True, slots=True)
class Operation:
    path: str
    success: int
    errors: frozenset[int]

    @property
    def statuses(self) -> str:
        return ", ".join(str(status) for status in sorted({self.success, *self.errors}))


OPERATIONS: dict[str, Operation] = {
    "generate": Operation("/token/generate", 201, _EVERY_OPERATION | {408, 429, 503}),
    "generate_batch": Operation("/token/generate/batch", 201, _EVERY_OPERATION | {408, 429, 503}),
    "consume": Operation("/token/consume", 200, _TOKEN_OPS | {403, 409}),
    "begin": Operation("/token/begin", 200, _TOKEN_OPS | {403, 409}),
    "renew": Operation("/token/renew", 200, (_TOKEN_OPS - {408}) | {409}),
    "complete": Operation("/token/complete", 200, _TOKEN_OPS | {409}),
    "fail": Operation("/token/fail", 200, _TOKEN_OPS | {409}),
    "inspect": Operation("/token/inspect", 200, _TOKEN_OPS),
    "revoke": Operation("/token/revoke", 200, _TOKEN_OPS),
}

# The statuses each error code is answered with (invalid_request: also gunicorn's refusals).
_CODE_STATUSES: dict[str, frozenset[int]] = {
    code: frozenset({cls.status}) for code, cls in ERRORS_BY_CODE.items()
} | {InvalidRequest.code: _UNREADABLE - {413}}
# The service's 500: a bug, or a worker killed mid-request. Like a 503 it says nothing about
# what happened (openapi.yaml: retry with the same request_id): ServiceUnavailable.
_INTERNAL_ERROR = "internal_error"

# The size cap: the service's largest replies are a stored result or error (at most
# TOKEN_SERVICE_MAX_RESULT_BYTES of compact JSON) in an envelope under 2 KiB, and issued tokens
# of at most 3,388 bytes each (every field at its longest: test_replies holds both), with room.
ENVELOPE_BYTES = 16 * 1024
TOKEN_BYTES = 4 * 1024


def cap_bytes(max_result_bytes: int = defaults.MAX_RESULT_BYTES, count: int = 0) -> int:
    """The most of a reply's body the SDK reads: for any operation, a result's worth and an
    envelope; for issuing ``count`` tokens, ``count`` tokens' worth more."""
    return ENVELOPE_BYTES + max_result_bytes + count * TOKEN_BYTES


class _Malformed(Exception):
    """The body is not the documented shape; the argument says how (never what it held)."""


def media_type(content_type: str | None) -> str | None:
    if not content_type:
        return None
    return content_type.split(";", 1)[0].strip().lower() or None


class Request(Protocol):
    operation: Operation
    read: Callable[[Any], Any]  # the body's JSON -> the operation's value
    cap: int


class Reading:
    """One reply, read as it arrives: its head judged at once (:meth:`__init__` raises for a
    status, media type, coding or declared length the contract does not allow), its body
    taken in up to the cap (:meth:`take`), then turned into the operation's value or its
    error (:meth:`result`)."""

    def __init__(self, request: Request, url: str, status: int, headers: Mapping[str, str]) -> None:
        operation = self.operation = request.operation
        self.request = request
        self.url = url
        self.status = status
        self.headers = headers
        self.media_type = media_type(headers.get("content-type"))
        self._chunks: list[bytes] = []
        self._size = 0
        self.transient = status in TRANSIENT_STATUSES
        if self.transient:
            # only a problem document is read (its detail, token_ref); an HTML page never is
            self.wants_body = self.media_type == PROBLEM_JSON and self._framing_problem() is None
            return
        if status == operation.success:
            wanted = JSON
        elif status in operation.errors:
            wanted = PROBLEM_JSON
        else:
            raise self.unexpected(
                f"{status} is not a status {operation.path} answers with ({operation.statuses})"
            )
        if self.media_type != wanted:
            raise self.unexpected(f"{operation.path} answers a {status} as {wanted}")
        framing = self._framing_problem()
        if framing:
            raise self.unexpected(framing)
        self.wants_body = True

    def _framing_problem(self) -> str | None:
        coding = (self.headers.get("content-encoding") or "identity").strip().lower()
        if coding != "identity":
            return f"its body is in a content coding ({coding[:32]}) the SDK did not ask for"
        declared = whole_number(self.headers.get("content-length") or "", max_digits=18)
        if declared is not None and declared > self.request.cap:
            return f"it declares {declared} bytes of body, over the {self.request.cap} the SDK reads"
        return None

    def take(self, chunk: bytes) -> None:
        """One more piece of the body; raises once the body goes past the cap."""
        self._size += len(chunk)
        if self._size > self.request.cap:
            if self.transient:
                raise self._unavailable(None)
            raise self.unexpected(f"its body goes on past the {self.request.cap} bytes the SDK reads")
        self._chunks.append(chunk)

    def result(self) -> Any:
        """The operation's value, or the error the reply stands for (raised)."""
        document = self._document() if self.wants_body else None
        if self.transient:
            raise self._unavailable(document)
        if self.status != self.operation.success:
            raise self._error(document)
        try:
            return self.request.read(document)
        except _Malformed as malformed:
            raise self.unexpected(str(malformed)) from None

    def _document(self) -> Any:
        body = b"".join(self._chunks)
        self._chunks = []
        try:
            return json.loads(body.decode("utf-8"), parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            if self.transient:
                return None
            if isinstance(exc, UnicodeDecodeError):
                raise self.unexpected("its body is not UTF-8") from None
            raise self.unexpected("its body is not JSON" if body else "its body is empty") from None

    def _unavailable(self, document: Any) -> TokenError:
        code = document.get("code") if isinstance(document, dict) else None
        if isinstance(code, str) and self.status in _CODE_STATUSES.get(code, ()):
            # the service's own 503: store_unavailable (retried), or issuance_paused (not at once)
            return problem_error(self.headers, document)
        said = "the request did not reach it in time" if self.status == 408 else "no answer from the service"
        message = f"HTTP {self.status} from {self.url}: {said}."
        return ServiceUnavailable(message, retry_after_seconds=_retry_after(self.headers) or 1)

    def _error(self, document: Any) -> TokenError:
        if not isinstance(document, dict):
            raise self.unexpected("its problem document is not a JSON object")
        code = document.get("code")
        if code == _INTERNAL_ERROR and self.status == 500:
            detail = document.get("detail")
            said = f": {detail[:200]}" if isinstance(detail, str) else ""
            return ServiceUnavailable(f"HTTP 500 from {self.url}, nothing known to have happened{said}")
        if not isinstance(code, str) or code not in ERRORS_BY_CODE:
            raise self.unexpected("its problem document has no code of the token API")
        if self.status not in _CODE_STATUSES[code]:
            raise self.unexpected(f"its problem document says {code}, which is never a {self.status}")
        return problem_error(self.headers, document)

    def unexpected(self, reason: str) -> UnexpectedReply:
        found = self.media_type or "no media type"
        return UnexpectedReply(
            f"{self.url} did not answer as a token service (HTTP {self.status}, {found}): {reason}.",
            reply_status=self.status,
            media_type=self.media_type,
            reason=reason,
        )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_TOKEN_REF = re.compile(r"[A-Za-z0-9_-]{22}")


def _retry_after(headers: Mapping[str, str]) -> int | None:
    """``Retry-After`` in whole seconds (at least 1); None for none, a date or anything else."""
    seconds = whole_number(headers.get("retry-after") or "", max_digits=9)
    return None if seconds is None else max(1, seconds)


def problem_error(headers: Mapping[str, str], document: dict[str, Any]) -> TokenError:
    """The error a problem document with one of the API's codes stands for: its ``code``'s class,
    with ``Retry-After`` and the document's ``token_ref`` on it."""
    detail = document.get("detail")
    body = dict(document)
    # the header first (a proxy may answer without a document); a date or anything else: the document's
    retry_after = _retry_after(headers)
    if retry_after is not None:
        body["retry_after_seconds"] = retry_after
    error = ERRORS_BY_CODE[document["code"]].from_problem(detail if isinstance(detail, str) else None, body)
    token_ref = document.get("token_ref")
    if isinstance(token_ref, str) and _TOKEN_REF.fullmatch(token_ref):
        error.token_ref = token_ref  # for the caller's logs: the operators find the record by it
    return error


# -- the success bodies, member by member ----------------------------------------------------------


def _object(document: Any) -> dict[str, Any]:
    if not isinstance(document, dict):
        raise _Malformed(f"its body is a JSON {_kind(document)}, not an object")
    return document


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return {list: "array", str: "string", int: "number", float: "number", dict: "object"}.get(
        type(value), type(value).__name__
    )


def _outcome(document: dict[str, Any], *allowed: str) -> str:
    outcome = document.get("outcome")
    if not isinstance(outcome, str) or outcome not in allowed:
        raise _Malformed(f"its outcome is not {' or '.join(repr(value) for value in allowed)}")
    return outcome


def _boolean(document: dict[str, Any], name: str) -> bool:
    value = document.get(name)
    if type(value) is not bool:
        raise _Malformed(f"its {name} is not true or false")
    return value


def _text(document: dict[str, Any], name: str, *, nullable: bool = False, max_length: int = 128) -> Any:
    value = document.get(name)
    if value is None and nullable:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= max_length:
        raise _Malformed(f"its {name} is not a string of 1 to {max_length} characters")
    return value


def _timestamp(document: dict[str, Any], name: str) -> datetime:
    value = document.get(name)
    try:
        if not isinstance(value, str) or len(value) > 40:
            raise ValueError(value)
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise _Malformed(f"its {name} is not an RFC 3339 time") from None
    return moment.astimezone(UTC)


def _lease_seconds(document: dict[str, Any]) -> float | None:
    """How long the lease runs, on the service's word; None from a service too old to say
    (the guard never falls back on ``lease_expires_at``: that is the service's clock, not ours)."""
    if "lease_seconds" not in document:
        return None
    value = document["lease_seconds"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 86400 * 366:
        raise _Malformed("its lease_seconds is not a number of seconds above 0")
    return float(value)


_TOKEN = re.compile(r"[A-Za-z0-9_-]{22,128}")


def _issued(item: Any) -> IssuedToken:
    item = _object(item)
    token = item.get("token")
    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        raise _Malformed("its token is not 22 to 128 URL-safe characters")
    ttl_seconds = item.get("ttl_seconds")
    if type(ttl_seconds) is not int or ttl_seconds < 1:
        raise _Malformed("its ttl_seconds is not a whole number above 0")
    return IssuedToken(
        token=token,
        scope=_text(item, "scope", max_length=64),
        subject=_text(item, "subject", nullable=True),
        fingerprint=_text(item, "fingerprint", nullable=True),
        ttl_seconds=ttl_seconds,
        expires_at=_timestamp(item, "expires_at"),
    )


def issued_one(document: Any) -> list[IssuedToken]:
    return [_issued(document)]


def issued_batch(count: int) -> Callable[[Any], list[IssuedToken]]:
    def read(document: Any) -> list[IssuedToken]:
        tokens = _object(document).get("tokens")
        if not isinstance(tokens, list) or len(tokens) != count:
            raise _Malformed(f"its tokens are not a list of the {count} asked for")
        return [_issued(item) for item in tokens]

    return read


def consumed(document: Any) -> Consumed:
    document = _object(document)
    _outcome(document, "consumed")
    return Consumed(replayed=_boolean(document, "replayed"))


def begun(document: Any) -> Started | Finished:
    document = _object(document)
    if _outcome(document, "started", "succeeded") == "succeeded":
        if document.get("replayed") is not True or "result" not in document:
            raise _Malformed("its stored result is not replayed: true with a result")
        return Finished(result=document["result"])
    lease_expires = _timestamp(document, "lease_expires_at")
    return Started(
        lease_id=_text(document, "lease_id", max_length=64),
        lease_expires_ms=int(lease_expires.timestamp() * 1000),
        replayed=_boolean(document, "replayed"),
        lease_seconds=_lease_seconds(document),
    )


def renewed(document: Any) -> Renewed:
    document = _object(document)
    _outcome(document, "renewed")
    return Renewed(
        lease_expires_ms=int(_timestamp(document, "lease_expires_at").timestamp() * 1000),
        lease_seconds=_lease_seconds(document),
    )


def completed(document: Any) -> Completed:
    document = _object(document)
    _outcome(document, "succeeded")
    return Completed(replayed=_boolean(document, "replayed"))


def fail_recorded(document: Any) -> FailRecorded:
    document = _object(document)
    outcome = _outcome(document, "released", "failed")
    return FailRecorded(outcome=outcome, replayed=_boolean(document, "replayed"))


_STATES = ("ISSUED", "PROCESSING", "CONSUMED", "SUCCEEDED", "FAILED")


def info(document: Any) -> TokenInfo:
    document = _object(document)
    state = document.get("state")
    if not isinstance(state, str) or state not in _STATES:
        raise _Malformed(f"its state is not one of {', '.join(_STATES)}")
    return TokenInfo(
        state=state,
        scope=_text(document, "scope", max_length=64),
        subject=_text(document, "subject", nullable=True),
        fingerprint=_text(document, "fingerprint", nullable=True),
        expires_at=_timestamp(document, "expires_at"),
        lease_expires_at=_timestamp(document, "lease_expires_at") if "lease_expires_at" in document else None,
        result=document.get("result"),
        error=document.get("error"),
    )


def revoked(document: Any) -> None:
    _outcome(_object(document), "revoked")
