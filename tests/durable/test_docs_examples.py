"""The Python examples and the ``db-cleanup`` transcript of docs/durable.md, run as written.

The payment endpoint (examples/payments.py) is run by tests/durable/test_payments_example.py,
the SQL blocks are checked by tests/durable/test_schema.py."""

from __future__ import annotations

import shlex
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.support.docs import Block, code_blocks, run_python
from token_service.client.durable import create_records_table, utc_now
from token_service.client.durable._schema import IDEMPOTENCY_RECORDS
from token_service.server.cli import main

PAGE = "docs/durable.md"


def examples() -> list[Block]:
    """The page's Python blocks other than the payment endpoint, which has its own test."""
    return [
        block
        for block in code_blocks(PAGE, "python")
        if not block.code.startswith("# examples/payments.py\n")
    ]


def test_the_page_has_the_examples_this_file_runs() -> None:
    assert len(examples()) == 3
    assert [block.lang for block in code_blocks(PAGE) if block.lang not in ("python", "sql")] == ["text"]


@pytest.mark.parametrize("block", examples(), ids=lambda block: block.where)
def test_python_example_runs_and_prints_what_the_page_says(block: Block) -> None:
    assert block.expected_output(), f"{block.where} should show what it prints"
    run_python(block, {"__name__": "__main__"})  # checks the `# →` comments


def test_db_cleanup_transcript(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    [block] = code_blocks(PAGE, "text")
    command, *shown = block.code.splitlines()
    argv = shlex.split(command.removeprefix("$ "))
    assert argv[0] == "token-service"
    # the page's PostgreSQL URL, replaced by a SQLite database seeded with as many expired records
    url = f"sqlite:///{tmp_path / 'shop.sqlite'}"
    argv[argv.index("--url") + 1] = url
    total = int(shown[-1].split()[2])
    engine = sa.create_engine(url)
    create_records_table(engine)
    expired = utc_now() - timedelta(hours=2)  # past --older-than 1h
    live = utc_now() + timedelta(days=1)
    with engine.begin() as conn:
        conn.execute(
            sa.insert(IDEMPOTENCY_RECORDS),
            [
                {
                    "record_key": f"k-{i}",
                    "status": "SUCCEEDED",
                    "response_status": 201,
                    "response_body": b"{}",
                    "created_at": expired - timedelta(days=7),
                    "updated_at": expired - timedelta(days=7),
                    "expires_at": expired if i < total else live,
                }
                for i in range(total + 3)
            ],
        )
    assert main(argv[1:]) == 0
    assert capsys.readouterr().out.splitlines() == shown
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(IDEMPOTENCY_RECORDS)).scalar_one() == 3
    engine.dispose()
