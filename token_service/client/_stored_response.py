"""One stored-response shape, and which responses are worth storing.

A duplicate gets back the first execution's :class:`StoredResponse` (status, headers as an
ordered list of pairs, body bytes, or the body's length in ``omitted`` when it was not kept),
with ``Idempotent-Replayed: true``. Kept in Redis by the Idempotency-Key middlewares
(:meth:`encode`), as a token's result by ``@require_token`` (:meth:`to_result`), in a database
row by the durable backstop. Which statuses are stored: :func:`default_store_status`;
what a token-guarded view answers for a refusal: :func:`refusal`
(docs/integrations/flask.md and its siblings).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from token_service import defaults
from token_service.errors import ServiceUnavailable, TokenError, Unauthorized

__all__ = [
    "CREDENTIAL_REFUSALS",
    "DEFAULT_MAX_RESULT_BYTES",
    "DEFAULT_REPLAY_HEADERS",
    "OMITTED_HEADER",
    "REPLAYED_HEADER",
    "UNAUTHENTICATED",
    "Headers",
    "StorePolicy",
    "StoredResponse",
    "default_store_status",
    "refusal",
]

log = logging.getLogger("token_service.client")

REPLAYED_HEADER = "Idempotent-Replayed"
OMITTED_HEADER = "Idempotent-Body-Omitted"

# A client may simply try again later: storing these would replay "later" for the whole TTL.
_TRANSIENT_4XX = frozenset({408, 409, 425, 429})
# "Who are you?": not an answer to the request but to its credentials; once the client has logged
# in, the same request (the same token, the same key) must run, not get the refusal back.
UNAUTHENTICATED = frozenset({401, 407})
# What the Idempotency-Key middlewares never store: the key is claimed under an identity the app
# has not verified yet (by default the raw Authorization header), and storing a stranger's
# refusals would let anyone who sends random credentials fill Redis. 403 is one of them there:
# many apps answer bad credentials with it (FastAPI's HTTPBearer does).
CREDENTIAL_REFUSALS = UNAUTHENTICATED | {403}

StorePolicy = Callable[[int], bool]

Headers = tuple[tuple[str, str], ...]

# The integrations' defaults (@require_token in Flask, FastAPI, Django): the headers a replay of a
# token-guarded view repeats, and what a stored response may take -- the service's default
# max_result_bytes (TOKEN_SERVICE_MAX_RESULT_BYTES).
DEFAULT_REPLAY_HEADERS = ("Content-Type", "Location")
DEFAULT_MAX_RESULT_BYTES = defaults.MAX_RESULT_BYTES


def default_store_status(status: int) -> bool:
    """Store 2xx, 3xx (a POST answered 303 did its work) and 4xx but 401/407/408/409/425/429;
    never 5xx."""
    return 200 <= status < 500 and status not in _TRANSIENT_4XX and status not in UNAUTHENTICATED


def refusal(error: TokenError) -> TokenError:
    """What a token-guarded view (Flask, FastAPI, Django) answers for the token service's refusal:
    the refusal itself, but for ``Unauthorized`` (this backend's own service key, nothing the
    user can fix) a ``503 store_unavailable``, failing closed, and a line in the log for ops."""
    if isinstance(error, Unauthorized):
        log.error("the token service refused this backend's service key; check its configuration")
        return ServiceUnavailable("The token service is not available to this backend.")
    return error


def _pairs(headers: Mapping[str, str] | Iterable[tuple[str, str]] | Iterable[list[str]]) -> Headers:
    items = headers.items() if isinstance(headers, Mapping) else headers
    return tuple((str(name), str(value)) for name, value in items)


@dataclass(frozen=True, slots=True, init=False)
class StoredResponse:
    """What a duplicate gets back: the first execution's status, body bytes and headers."""

    status: int
    body: bytes
    headers: Headers
    omitted: int | None

    def __init__(
        self,
        status: int,
        body: bytes = b"",
        headers: Mapping[str, str] | Iterable[tuple[str, str]] = (),
        *,
        omitted: int | None = None,
    ) -> None:
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 999:
            raise ValueError(f"a status is a three-digit number, not {status!r}")
        if not isinstance(body, bytes | bytearray | memoryview):
            raise TypeError(f"a stored body is bytes, not {type(body).__name__}")
        object.__setattr__(self, "status", status)
        object.__setattr__(self, "body", bytes(body))
        object.__setattr__(self, "headers", _pairs(headers))
        object.__setattr__(self, "omitted", omitted)

    @classmethod
    def json(cls, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> StoredResponse:
        body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
        return cls(status, body, {"Content-Type": "application/json", **(headers or {})})

    def payload(self) -> Any:
        return json.loads(self.body)

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        wanted = name.lower()
        return next((value for key, value in self.headers if key.lower() == wanted), None)

    def replay_headers(self) -> list[tuple[str, str]]:
        """The headers a duplicate gets: the stored ones, the omitted marker, ``Idempotent-Replayed``."""
        headers = [(name, value) for name, value in self.headers if name.lower() != REPLAYED_HEADER.lower()]
        if self.omitted is not None:
            headers = [
                (n, v) for n, v in headers if n.lower() not in ("content-length", OMITTED_HEADER.lower())
            ]
            headers.append((OMITTED_HEADER, str(self.omitted)))
        headers.append((REPLAYED_HEADER, "true"))
        return headers

    # -- the Redis form (the Idempotency-Key middlewares) ------------------------------------

    def encode(self) -> bytes:
        """Compact: a one-line JSON head, a newline, then the body's raw bytes."""
        return self.encode_head() + self.body

    def encode_head(self) -> bytes:
        """:meth:`encode` up to the body: the JSON head and its newline (a store may send the two apart
        rather than copy a large body once more to join them)."""
        head: dict[str, Any] = {"s": self.status, "h": self.headers}
        if self.omitted is not None:
            head["o"] = self.omitted
        return json.dumps(head, separators=(",", ":"), ensure_ascii=True).encode("ascii") + b"\n"

    @classmethod
    def decode(cls, raw: bytes) -> StoredResponse:
        head, _, body = raw.partition(b"\n")
        parsed = json.loads(head)
        headers = [(name, value) for name, value in parsed["h"]]
        omitted = parsed.get("o")
        # records written before "o" existed carried the marker as a header
        for name, value in headers:
            if omitted is None and name.lower() == OMITTED_HEADER.lower() and value.isdigit():
                omitted = int(value)
        return cls(parsed["s"], body, headers, omitted=omitted)

    # -- the JSON form (a token's result, ``@require_token``) ---------------------------------

    def to_result(self) -> dict[str, Any]:
        """JSON-able: the body as UTF-8 text when it is, else base64 (``"e": "base64"``)."""
        result: dict[str, Any] = {"s": self.status, "h": [[name, value] for name, value in self.headers]}
        if self.omitted is not None:
            result["omitted"] = self.omitted
            return result
        try:
            result["b"] = self.body.decode("utf-8")
        except UnicodeDecodeError:
            result["b"] = base64.b64encode(self.body).decode("ascii")
            result["e"] = "base64"
        return result

    @classmethod
    def from_result(cls, result: Any) -> StoredResponse:
        if (
            not isinstance(result, dict)
            or isinstance(result.get("s"), bool)
            or not isinstance(result.get("s"), int)
        ):
            # Not written by a response guard (another kind of guard used the token's scope).
            raise TypeError("the token's stored result is not a stored response")
        text = result.get("b", "")
        body = base64.b64decode(text) if result.get("e") == "base64" else text.encode("utf-8")
        return cls(result["s"], body, result.get("h", []), omitted=result.get("omitted"))

    # -- the database form (the durable backstop) ---------------------------------------------

    def headers_json(self) -> str:
        """An object when no name repeats (what earlier versions wrote), else a list of pairs."""
        names = [name.lower() for name, _ in self.headers]
        value: Any = dict(self.headers) if len(set(names)) == len(names) else [list(p) for p in self.headers]
        return json.dumps(value, separators=(",", ":"))
