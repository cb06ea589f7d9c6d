"""The durable backstop: idempotency records, state transitions and versioned updates.

Redis can forget (a failover to a replica that missed the write, a crash
between fsyncs). The last line of defence is a unique key in the business's
own database, written in the same transaction as the business effect. This
package gives that line under the same key as the token (its digest), plus the
two other database-side principles: state-machine transitions and optimistic
locking. SQLAlchemy Core 2.x; PostgreSQL, MySQL/MariaDB and SQLite. No Flask.

Install with ``pip install 'idempotency-token-service[db]'``.
"""

from token_service.client._extras import install, missing

try:
    import sqlalchemy  # noqa: F401 -- the modules below need it: say which extra brings it
except ModuleNotFoundError as exc:
    missing(exc, __name__, ("sqlalchemy",), install("db"))

from token_service.client._fingerprint import fingerprint as request_fingerprint
from token_service.client._stored_response import StoredResponse
from token_service.client.durable._cleanup import delete_expired
from token_service.client.durable._guard import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_RECORD_TTL_SECONDS,
    Claim,
    Outcome,
    Replay,
    claim,
    complete,
    database_now,
    fail,
    is_retryable,
    retry_transaction,
    run_once,
    run_once_for_token,
    token_record_key,
    utc_now,
)
from token_service.client.durable._schema import (
    DIALECTS,
    FAILED,
    IDEMPOTENCY_RECORDS,
    PROCESSING,
    STATUSES,
    SUCCEEDED,
    create_records_table,
    ddl,
    records_table,
)
from token_service.client.durable._transitions import StateMachine, update_versioned
from token_service.errors import (
    FingerprintMismatch,
    IllegalTransition,
    LeaseLost,
    RecordError,
    RecordFailed,
    RecordInProgress,
    RowNotFound,
    StaleVersion,
    TokenUsed,
)

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "DEFAULT_RECORD_TTL_SECONDS",
    "DIALECTS",
    "FAILED",
    "IDEMPOTENCY_RECORDS",
    "PROCESSING",
    "STATUSES",
    "SUCCEEDED",
    "Claim",
    "FingerprintMismatch",
    "IllegalTransition",
    "LeaseLost",
    "Outcome",
    "RecordError",
    "RecordFailed",
    "RecordInProgress",
    "Replay",
    "RowNotFound",
    "StaleVersion",
    "StateMachine",
    "StoredResponse",
    "TokenUsed",
    "claim",
    "complete",
    "create_records_table",
    "database_now",
    "ddl",
    "delete_expired",
    "fail",
    "is_retryable",
    "records_table",
    "request_fingerprint",
    "retry_transaction",
    "run_once",
    "run_once_for_token",
    "token_record_key",
    "update_versioned",
    "utc_now",
]
