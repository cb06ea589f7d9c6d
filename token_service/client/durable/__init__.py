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
    Claim,
    Outcome,
    Replay,
    claim,
    complete,
    fail,
    retry_transaction,
    run_once,
    run_once_for_token,
    token_record_key,
    utc_now,
)
from token_service.client.durable._schema import create_records_table, ddl, records_table
from token_service.client.durable._transitions import StateMachine, update_versioned
from token_service.errors import (
    FingerprintMismatch,
    IllegalTransition,
    RecordFailed,
    RecordInProgress,
    RowNotFound,
    StaleVersion,
)

# What docs/durable.md teaches: the entry points, what they return and the errors a caller
# catches. The rest (the default table object, the status names, the defaults, the database
# clock) is the package's own: durable._schema and durable._guard, for the SDK's other modules.
__all__ = [
    "Claim",
    "FingerprintMismatch",
    "IllegalTransition",
    "Outcome",
    "RecordFailed",
    "RecordInProgress",
    "Replay",
    "RowNotFound",
    "StaleVersion",
    "StateMachine",
    "StoredResponse",
    "claim",
    "complete",
    "create_records_table",
    "ddl",
    "delete_expired",
    "fail",
    "records_table",
    "request_fingerprint",
    "retry_transaction",
    "run_once",
    "run_once_for_token",
    "token_record_key",
    "update_versioned",
    "utc_now",
]
