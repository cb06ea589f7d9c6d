"""``Idempotency-Key`` middleware for any WSGI app (IETF draft-ietf-httpapi-idempotency-key-header).

::

    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, redis.Redis.from_url(url))

For the unsafe methods (POST and PATCH by default) the client sends a key of
its choosing, ``Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"``.
The key is namespaced per client identity (``identity(environ)``, by default
the ``Authorization`` header, else ``REMOTE_USER``), and the request is
fingerprinted (method, path, query string, body). A request with a key but no
identity (``identity`` returns ``""`` or ``None``) gets 400
``idempotency_identity_required`` and does not run: anonymous clients would all
share one namespace and could be handed each other's responses. Pass your own
``identity`` to key on a stable principal (the user id behind an OAuth token:
the raw header changes when the token is refreshed), or return a constant on
purpose to share keys between anonymous clients. Then:

- the first request with a key runs, and its response (status, headers,
  body) is stored for ``ttl_seconds``;
- a repeat gets the stored response, with ``Idempotent-Replayed: true``,
  without the app running;
- a repeat while the first is still running gets 409 (``Retry-After`` set);
- the same key with a different request gets 422;
- no key gets 400 when ``required`` (else the request just runs);
- a 5xx response or an exception is not stored: the key is freed for a retry.

Redis failures answer 503 (fail closed: the request does not run unguarded),
and so does a record the store refuses (e.g. the key holds something else).

The lock is not extended while the app runs: a request that takes longer than
``lock_seconds`` lets a concurrent repeat run too (its own response is then not
stored). Set ``lock_seconds`` above your slowest request.
Everything is one Lua script per step (:mod:`token_service.client._idempotency_store`).
No Flask needed.
"""

from __future__ import annotations

import io
import logging
import secrets
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from token_service.client._idempotency_store import (
    Claimed,
    IdempotencyStore,
    InProgress,
    Mismatch,
    StoredResponse,
    request_fingerprint,
)
from token_service.errors import InvalidRequest, PayloadTooLarge, ServiceUnavailable, TokenError
from token_service.problems import problem, problem_for

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

log = logging.getLogger(__name__)

REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_CHARS = 255
# Never replayed: they describe one connection or one moment, or belong to one session.
_NOT_STORED = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-authenticate",
        "date",
        "server",
        "set-cookie",
    }
)

Answer = tuple[int, list[tuple[str, str]], bytes]


def default_identity(environ: WSGIEnvironment) -> str:
    """Who the client is: its credentials (hashed into the record key, never stored); "" if unknown."""
    return str(environ.get("HTTP_AUTHORIZATION") or environ.get("REMOTE_USER") or "")


def parse_key(raw: str) -> str | None:
    """The key from the header: an sf-string (``"..."``); a bare token is accepted too."""
    value = raw.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    if not 1 <= len(value) <= MAX_KEY_CHARS or not value.isascii() or not value.isprintable():
        return None
    return value


def _status_line(status: int) -> str:
    from http import HTTPStatus

    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Unknown"


class IdempotencyMiddleware:
    """Wrap a WSGI app so that each ``Idempotency-Key`` runs at most one request (see module docs)."""

    def __init__(
        self,
        app: WSGIApplication,
        store: IdempotencyStore | Any,
        *,
        header: str = "Idempotency-Key",
        methods: Iterable[str] = ("POST", "PATCH"),
        required: bool = True,
        applies: Callable[[WSGIEnvironment], bool] | None = None,
        identity: Callable[[WSGIEnvironment], str | None] = default_identity,
        ttl_seconds: int = 86400,
        lock_seconds: int = 60,
        max_body_bytes: int = 1024 * 1024,
        max_stored_bytes: int = 256 * 1024,
        key_prefix: str = "ts:",
    ) -> None:
        for name, value in (("ttl_seconds", ttl_seconds), ("lock_seconds", lock_seconds)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive whole number of seconds, not {value!r}")
        self.app = app
        self.store = (
            store if isinstance(store, IdempotencyStore) else IdempotencyStore(store, key_prefix=key_prefix)
        )
        self.header = header
        self.environ_key = "HTTP_" + header.upper().replace("-", "_")
        self.methods = frozenset(method.upper() for method in methods)
        self.required = required
        self.applies = applies
        self.identity = identity
        self.ttl_seconds = ttl_seconds
        self.lock_seconds = lock_seconds
        self.max_body_bytes = max_body_bytes
        self.max_stored_bytes = max_stored_bytes

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD", "GET").upper() not in self.methods or (
            self.applies is not None and not self.applies(environ)
        ):
            return self.app(environ, start_response)
        raw_key = environ.get(self.environ_key)
        if raw_key is None or not raw_key.strip():
            if not self.required:
                return self.app(environ, start_response)
            return self._problem(
                start_response,
                InvalidRequest(f"The {self.header} header is required.", {self.header: ["Missing."]}),
            )
        key = parse_key(raw_key)
        if key is None:
            return self._problem(
                start_response,
                InvalidRequest(
                    f"The {self.header} header is not a valid key.",
                    {self.header: [f"1-{MAX_KEY_CHARS} printable ASCII characters."]},
                ),
            )
        body = self._read_body(environ)
        if body is None:
            return self._problem(start_response, PayloadTooLarge("The request body is over the limit."))
        return self._guarded(environ, start_response, key, body)

    # -- the protocol ----------------------------------------------------------

    def _guarded(
        self, environ: WSGIEnvironment, start_response: StartResponse, key: str, body: bytes
    ) -> Iterable[bytes]:
        fingerprint = request_fingerprint(
            environ.get("REQUEST_METHOD", ""),
            environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", ""),
            environ.get("QUERY_STRING", ""),
            body,
        )
        identity = self.identity(environ)
        if not identity:
            return self._answer(
                start_response,
                problem(
                    400,
                    "idempotency_identity_required",
                    "Unidentified client",
                    f"An {self.header} is kept per client: send the request with your credentials.",
                ),
            )
        record = self.store.key(identity, key)
        owner = secrets.token_urlsafe(12)
        try:
            claim = self.store.begin(record, fingerprint, owner, self.lock_seconds)
        except ServiceUnavailable as exc:
            return self._problem(start_response, exc)
        except (TokenError, ValueError, KeyError, TypeError) as exc:
            # the store refused the record (not an idempotency record, unreadable): fail closed
            log.error("the idempotency store refused a request: %s", exc)
            return self._problem(
                start_response,
                ServiceUnavailable(
                    "The idempotency store could not handle this key; the request did not run."
                ),
            )
        if isinstance(claim, StoredResponse):
            headers = [*claim.headers, (REPLAYED_HEADER, "true")]
            start_response(_status_line(claim.status), headers)
            return [claim.body]
        if isinstance(claim, InProgress):
            return self._answer(
                start_response,
                problem(
                    409,
                    "idempotency_key_in_use",
                    "Request in progress",
                    "A request with this Idempotency-Key is still being processed; retry later.",
                    retry_after_seconds=claim.retry_after_seconds,
                ),
                extra_headers=[("Retry-After", str(claim.retry_after_seconds))],
            )
        if isinstance(claim, Mismatch):
            return self._answer(
                start_response,
                problem(
                    422,
                    "idempotency_key_mismatch",
                    "Idempotency-Key reused",
                    "This Idempotency-Key was used for a different request.",
                ),
            )
        assert isinstance(claim, Claimed)
        try:
            status, headers, content = self._run_app(environ)
        except BaseException:
            self._release(record, fingerprint, owner)
            raise
        if status >= 500:
            self._release(record, fingerprint, owner)
        else:
            self._keep(record, fingerprint, owner, status, headers, content)
        start_response(_status_line(status), headers)
        return [content]

    def _run_app(self, environ: WSGIEnvironment) -> Answer:
        captured: dict[str, Any] = {}
        written: list[bytes] = []

        def capture(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Callable[[bytes], Any]:
            captured["status"] = int(status.split(" ", 1)[0])
            captured["headers"] = list(headers)
            return written.append

        result = self.app(environ, capture)
        try:
            chunks: Iterator[bytes] = iter(result)
            content = b"".join([*written, *chunks])
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        return captured["status"], captured["headers"], content

    def _keep(
        self,
        record: str,
        fingerprint: str,
        owner: str,
        status: int,
        headers: list[tuple[str, str]],
        content: bytes,
    ) -> None:
        kept = [(name, value) for name, value in headers if name.lower() not in _NOT_STORED]
        if len(content) > self.max_stored_bytes:
            # too large to keep: duplicates get the status and headers, and learn the body was dropped
            kept = [(n, v) for n, v in kept if n.lower() != "content-length"]
            kept.append(("Idempotent-Body-Omitted", str(len(content))))
            content = b""
        try:
            stored = self.store.store(
                record, fingerprint, owner, StoredResponse(status, kept, content), self.ttl_seconds
            )
        except TokenError as exc:
            log.error("could not store an idempotent response: %s", exc)
            return
        if not stored:
            log.warning(
                "an idempotent request outlived its %d s lock; its response was not stored", self.lock_seconds
            )

    def _release(self, record: str, fingerprint: str, owner: str) -> None:
        try:
            self.store.release(record, fingerprint, owner)
        except TokenError as exc:
            # the claim runs out by itself after lock_seconds
            log.error("could not free an Idempotency-Key: %s", exc)

    # -- plumbing --------------------------------------------------------------

    def _read_body(self, environ: WSGIEnvironment) -> bytes | None:
        """The whole body (None when over the limit); the app gets a fresh stream of it."""
        stream = environ.get("wsgi.input")
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > self.max_body_bytes:
            return None
        if stream is None:
            body = b""
        elif length:
            body = stream.read(length)
        elif environ.get("wsgi.input_terminated"):
            body = stream.read(self.max_body_bytes + 1)
            if len(body) > self.max_body_bytes:
                return None
        else:
            body = b""
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        return body

    def _problem(self, start_response: StartResponse, error: Any) -> Iterable[bytes]:
        return self._answer(start_response, problem_for(error))

    def _answer(
        self,
        start_response: StartResponse,
        answer: tuple[int, dict[str, str], bytes],
        extra_headers: list[tuple[str, str]] | None = None,
    ) -> Iterable[bytes]:
        status, headers, body = answer
        header_list = [*headers.items(), *(extra_headers or []), ("Content-Length", str(len(body)))]
        start_response(_status_line(status), header_list)
        return [body]
