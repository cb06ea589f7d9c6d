"""Deleting expired records in small batches, each its own short transaction.

One big ``DELETE … WHERE expires_at < :cutoff`` would hold its row (and InnoDB's gap) locks
until it finished, stalling the very inserts it races with, in one huge transaction. A batch
picks at most ``batch_size`` keys by the ``expires_at`` index, then deletes those keys
re-checking the expiry (a record reset by a new claim in between is kept): two statements, as
MySQL allows no ``LIMIT`` in an ``IN`` subquery.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from token_service.client.durable._guard import Clock, database_now
from token_service.client.durable._schema import IDEMPOTENCY_RECORDS

__all__ = ["delete_expired"]


def delete_expired(
    engine: Engine,
    *,
    table: sa.Table = IDEMPOTENCY_RECORDS,
    older_than_seconds: float = 0,
    batch_size: int = 1000,
    pause_seconds: float = 0.0,
    progress: Callable[[int, int], None] | None = None,
    clock: Clock | None = None,
) -> int:
    """Delete records that expired more than ``older_than_seconds`` ago; returns how many.

    ``progress(deleted_in_batch, deleted_so_far)`` after each batch, ``pause_seconds`` between
    them. "Expired" is by the database's clock (``clock``: tests only), which wrote the expiries:
    a host whose clock runs ahead must not delete a record that still refuses a second execution.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    if older_than_seconds < 0:
        raise ValueError("older_than_seconds must not be negative")
    cutoff = database_now(engine.dialect.name, -older_than_seconds, clock)
    expired = table.c.expires_at < cutoff
    total = 0
    while True:
        with engine.begin() as conn:
            keys = (
                conn.execute(
                    sa.select(table.c.record_key)
                    .where(expired)
                    .order_by(table.c.expires_at)
                    .limit(batch_size)
                )
                .scalars()
                .all()
            )
            if not keys:
                return total
            deleted = conn.execute(sa.delete(table).where(table.c.record_key.in_(keys), expired)).rowcount
        total += deleted
        if progress is not None:
            progress(deleted, total)
        if len(keys) < batch_size:
            return total
        if pause_seconds:
            time.sleep(pause_seconds)
