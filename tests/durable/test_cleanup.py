"""Expired records are deleted in batches, by the helper and by ``token-service db-cleanup``."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

from tests.durable.databases import Db
from token_service.client.durable import delete_expired, utc_now
from token_service.server.cli import main


def add_records(db: Db, prefix: str, count: int, expires_at: datetime) -> None:
    with db.engine.begin() as conn:
        conn.execute(
            sa.insert(db.records),
            [
                {
                    "record_key": f"{prefix}-{i}",
                    "status": "SUCCEEDED",
                    "response_status": 200,
                    "response_body": b"{}",
                    "created_at": expires_at - timedelta(days=1),
                    "updated_at": expires_at - timedelta(days=1),
                    "expires_at": expires_at + timedelta(microseconds=i),
                }
                for i in range(count)
            ],
        )


def keys(db: Db) -> set[str]:
    with db.engine.connect() as conn:
        return set(conn.execute(sa.select(db.records.c.record_key)).scalars())


def test_delete_expired_works_in_batches_and_keeps_live_records(db: Db) -> None:
    now = datetime(2030, 1, 1)
    add_records(db, "old", 15, now - timedelta(hours=3))
    add_records(db, "recent", 4, now - timedelta(minutes=5))
    add_records(db, "live", 6, now + timedelta(hours=1))
    batches: list[tuple[int, int]] = []

    deleted = delete_expired(
        db.engine,
        table=db.records,
        older_than_seconds=3600,
        batch_size=4,
        progress=lambda batch, total: batches.append((batch, total)),
        clock=lambda: now,
    )
    assert deleted == 15
    assert batches == [(4, 4), (4, 8), (4, 12), (3, 15)]
    assert keys(db) == {f"recent-{i}" for i in range(4)} | {f"live-{i}" for i in range(6)}

    assert delete_expired(db.engine, table=db.records, clock=lambda: now) == 4
    assert keys(db) == {f"live-{i}" for i in range(6)}


def test_db_cleanup_command(db: Db, capsys: pytest.CaptureFixture[str]) -> None:
    add_records(db, "old", 5, utc_now() - timedelta(days=2))
    add_records(db, "live", 2, utc_now() + timedelta(days=2))
    code = main(
        ["db-cleanup", "--url", db.url, "--table", db.records.name, "--older-than", "1d", "--batch-size", "2"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.splitlines() == [
        "db-cleanup: deleted 2 records in this batch, 2 so far",
        "db-cleanup: deleted 2 records in this batch, 4 so far",
        "db-cleanup: deleted 1 records in this batch, 5 so far",
        f"db-cleanup: done, 5 expired records deleted from {db.records.name}",
    ]
    assert keys(db) == {"live-0", "live-1"}


def test_db_cleanup_reports_a_missing_table(db: Db, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db-cleanup", "--url", db.url, "--table", "no_such_table_here"]) == 1
    assert "db-cleanup failed on no_such_table_here" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--url", "sqlite://", "--older-than", "3 weeks"], "not a duration"),
        (["--url", "sqlite://", "--batch-size", "0"], "not a positive integer"),
    ],
)
def test_db_cleanup_rejects_bad_arguments(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["db-cleanup", *argv])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_db_cleanup_rejects_an_unknown_database_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db-cleanup", "--url", "nosuchdb://x/y"]) == 2
    assert "cannot use database URL" in capsys.readouterr().err
