"""The errors of the idempotency records in the business database (``token_service.client.durable``).

They live in the one error tree, :mod:`token_service.errors` (drawn at its top),
and are re-exported here for the durable modules. They subclass ``TokenError``,
so ``problems.problem_for`` and the SDK's web integrations answer them like any
other; but they never travel over HTTP as codes of the token API, so they are
not in ``errors.ERRORS_BY_CODE``: ``code``/``status`` say how a backend would
answer them.
"""

from __future__ import annotations

from token_service.errors import (
    FingerprintMismatch,
    IllegalTransition,
    RecordError,
    RecordFailed,
    RecordInProgress,
    RowNotFound,
    StaleVersion,
)

__all__ = [
    "FingerprintMismatch",
    "IllegalTransition",
    "RecordError",
    "RecordFailed",
    "RecordInProgress",
    "RowNotFound",
    "StaleVersion",
]
