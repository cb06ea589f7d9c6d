"""A reference model of the token state table (docs/http-api.md), in plain Python.

Written from the contract (the token states, the HTTP operations and the
error table of docs/http-api.md and openapi.yaml), not from ``lua/``: the
state machine test compares the store against it. Where the contract is
silent the model makes the choice a careful user would expect, and says so:

- A binding mismatch is reported before the state (a caller with the wrong
  scope learns nothing about the token), checking scope, then subject, then
  fingerprint; binding is exact (a token issued without a subject must be
  presented without one).
- A PROCESSING token whose lease has run out is ISSUED again ("usable
  again") until its own expiry; a live lease keeps the token for its holder
  even past the token's expiry, so the holder can finish.
- A lease is fenced as soon as it runs out, not only once another begin took
  over: a stale holder finishing after a consume won would be a second winner.
- A renewal extends only the live lease, to ``now + lease`` or its current
  expiry, whichever is later (a late retry of an older renewal never shortens
  it); a lease that ran out stays lost, like one another begin took over.
- Retries are idempotent: the request id that won a consume (or holds a live
  lease) gets the win again, flagged ``replayed``; a complete/fail retried with
  the lease that finished the token reports the recorded outcome, ``replayed``.
- Records live exactly as long as the contract's minimum: ISSUED and CONSUMED until
  the token's expiry, SUCCEEDED and FAILED until the later of the token's
  expiry and ``result_ttl`` after they finished.

Every operation returns an *outcome tuple*; the test turns the store's replies
and exceptions into the same shape, so one ``==`` compares them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

ISSUED = "ISSUED"
PROCESSING = "PROCESSING"
CONSUMED = "CONSUMED"
SUCCEEDED = "SUCCEEDED"
FAILED = "FAILED"

Outcome = tuple[Any, ...]


@dataclass
class ModelToken:
    scope: str
    subject: str | None
    fingerprint: str | None
    expires_ms: int
    state: str = ISSUED
    lease_id: str | None = None
    lease_expires_ms: int = 0
    begin_request_id: str | None = None
    consume_request_id: str | None = None
    released_by: str | None = None  # the lease whose retryable fail made it ISSUED again
    finished_by: str | None = None  # the lease that completed or failed it for good
    payload: Any = None
    retain_until_ms: int = 0


class TokenModel:
    def __init__(self, now_ms: int, result_ttl_ms: int) -> None:
        self.now_ms = now_ms
        self.result_ttl_ms = result_ttl_ms
        self.tokens: dict[str, ModelToken] = {}
        self.expirations = 0  # records that timed out (not revoked): how much expiry was exercised

    # -- what a caller would see now -------------------------------------------------
    def live(self, token: str) -> ModelToken | None:
        """The token's record as of now, or None when it is gone (unknown, expired, revoked)."""
        t = self.tokens.get(token)
        if t is None:
            return None
        now = self.now_ms
        if t.state == PROCESSING and t.lease_expires_ms <= now:
            # the holder's lease ran out: usable again, as if it had never been begun
            t.state, t.lease_id, t.begin_request_id = ISSUED, None, None
        if t.state in (ISSUED, CONSUMED):
            alive = now < t.expires_ms
        elif t.state == PROCESSING:
            alive = True  # a live lease outlives the token's own expiry
        else:
            alive = now < t.retain_until_ms
        if not alive:
            self.expirations += 1
            del self.tokens[token]
            return None
        return t

    def record_ttl_ms(self, t: ModelToken) -> int:
        if t.state in (ISSUED, CONSUMED):
            return t.expires_ms - self.now_ms
        if t.state == PROCESSING:
            return max(t.expires_ms, t.lease_expires_ms) - self.now_ms
        return t.retain_until_ms - self.now_ms

    @staticmethod
    def _mismatch(t: ModelToken, scope: str, subject: str | None, fingerprint: str | None) -> str | None:
        if t.scope != scope:
            return "scope"
        if t.subject != subject:
            return "subject"
        if t.fingerprint != fingerprint:
            return "fingerprint"
        return None

    def _in_progress(self, t: ModelToken) -> Outcome:
        return ("token_in_progress", max(1, math.ceil((t.lease_expires_ms - self.now_ms) / 1000)))

    # -- operations ------------------------------------------------------------------
    def generate(
        self, token: str, scope: str, subject: str | None, fingerprint: str | None, ttl_ms: int
    ) -> None:
        self.tokens[token] = ModelToken(scope, subject, fingerprint, expires_ms=self.now_ms + ttl_ms)

    def consume(
        self, token: str, scope: str, subject: str | None, fingerprint: str | None, request_id: str | None
    ) -> Outcome:
        t = self.live(token)
        if t is None:
            return ("token_invalid",)
        field = self._mismatch(t, scope, subject, fingerprint)
        if field:
            return ("token_mismatch", field)
        if t.state == CONSUMED:
            if request_id is not None and request_id == t.consume_request_id:
                return ("consumed", True)
            return ("token_used",)
        if t.state == SUCCEEDED:
            return ("token_used",)
        if t.state == FAILED:
            return ("token_failed", t.payload)
        if t.state == PROCESSING:
            return self._in_progress(t)
        t.state, t.consume_request_id, t.released_by = CONSUMED, request_id, None
        return ("consumed", False)

    def begin(
        self,
        token: str,
        scope: str,
        subject: str | None,
        fingerprint: str | None,
        request_id: str | None,
        lease_ms: int,
    ) -> Outcome:
        """``("started", replayed, lease_id or None for a new lease, lease_expires_ms)`` or an error."""
        t = self.live(token)
        if t is None:
            return ("token_invalid",)
        field = self._mismatch(t, scope, subject, fingerprint)
        if field:
            return ("token_mismatch", field)
        if t.state == CONSUMED:
            return ("token_used",)
        if t.state == SUCCEEDED:
            return ("succeeded", t.payload)
        if t.state == FAILED:
            return ("token_failed", t.payload)
        if t.state == PROCESSING:
            if request_id is not None and request_id == t.begin_request_id:
                return ("started", True, t.lease_id, t.lease_expires_ms)
            return self._in_progress(t)
        return ("started", False, None, self.now_ms + lease_ms)

    def started(self, token: str, request_id: str | None, lease_id: str, lease_ms: int) -> None:
        """Record the lease the store chose for a begin the model predicted as a new start."""
        t = self.tokens[token]
        t.state, t.lease_id, t.lease_expires_ms = PROCESSING, lease_id, self.now_ms + lease_ms
        t.begin_request_id, t.released_by = request_id, None

    def renew(self, token: str, lease_id: str, lease_ms: int) -> Outcome:
        """``("renewed", lease_expires_ms)``: only the live lease is extended, never shortened."""
        t = self.live(token)
        if t is None:
            return ("token_invalid",)
        if t.state != PROCESSING or t.lease_id != lease_id:
            return ("lease_lost",)
        t.lease_expires_ms = max(t.lease_expires_ms, self.now_ms + lease_ms)
        return ("renewed", t.lease_expires_ms)

    def complete(self, token: str, lease_id: str, result: Any) -> Outcome:
        t = self.live(token)
        if t is None:
            return ("token_invalid",)
        if t.state == SUCCEEDED and t.finished_by == lease_id:
            return ("succeeded", True)
        if t.state != PROCESSING or t.lease_id != lease_id:
            return ("lease_lost",)
        self._finish(t, SUCCEEDED, lease_id, result)
        return ("succeeded", False)

    def fail(self, token: str, lease_id: str, retryable: bool, error: Any) -> Outcome:
        t = self.live(token)
        if t is None:
            return ("token_invalid",)
        if t.state == FAILED and t.finished_by == lease_id:
            return ("failed", True)
        if retryable and t.state == ISSUED and t.released_by == lease_id:
            return ("released", True)
        if t.state != PROCESSING or t.lease_id != lease_id:
            return ("lease_lost",)
        if retryable:
            t.state, t.lease_id, t.begin_request_id, t.released_by = ISSUED, None, None, lease_id
            self.live(token)  # a lease that outlived the token releases it into oblivion
            return ("released", False)
        self._finish(t, FAILED, lease_id, error)
        return ("failed", False)

    def _finish(self, t: ModelToken, state: str, lease_id: str, payload: Any) -> None:
        t.state, t.finished_by, t.payload, t.lease_id = state, lease_id, payload, None
        t.retain_until_ms = max(t.expires_ms, self.now_ms + self.result_ttl_ms)

    def inspect(self, token: str) -> Outcome:
        """``(state, scope, subject, fingerprint, lease_expires_ms or None, result, error)``."""
        t = self.live(token)
        if t is None:
            return ("token_invalid",)
        lease = t.lease_expires_ms if t.state == PROCESSING else None
        result = t.payload if t.state == SUCCEEDED else None
        error = t.payload if t.state == FAILED else None
        return (t.state, t.scope, t.subject, t.fingerprint, lease, result, error)

    def revoke(self, token: str) -> Outcome:
        if self.live(token) is None:
            return ("token_invalid",)
        del self.tokens[token]
        return ("revoked",)

    def advance(self, ms: int) -> None:
        self.now_ms += ms
