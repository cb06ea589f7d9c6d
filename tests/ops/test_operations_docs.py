"""Every code block of docs/operations.md, run as written against a real Redis and gunicorn.

The story the page tells is set up first: a checkout whose ``begin`` holder died
(request id ``order-1138``, the token_ref an operator copies from the log), an
Idempotency-Key the middleware answered, and a stuck row of the SQL backstop.
Then the blocks run in order: shell blocks with bash (the documented
127.0.0.1:8000 pointed at the gunicorn), the completer module imported by the
CLI's reconcile, the SQL block exec'd.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.ops.clock import past_clock
from tests.support.docs import code_blocks, run_python, run_sh, shell_env
from tests.support.processes import REPO_ROOT, Gunicorn, RedisServer
from tests.support.service import service_env
from token_service.client import durable
from token_service.client._idempotency_store import IdempotencyStore
from token_service.client._stored_response import StoredResponse
from token_service.client.durable._schema import IDEMPOTENCY_RECORDS
from token_service.records import IssueRequest, UseRequest
from token_service.store import TokenStore
from token_service.tokens import token_digest

PAGE = "docs/operations.md"
ADMIN_KEY = "ops-docs-admin-key-000000000001"

PAYMENTS = """
CHARGES = {"order-1138": {"id": "ch_1138", "status": "succeeded"}, "token:order-77": {"id": "ch_77"}}


def find_charge(order_id):
    return CHARGES.get(order_id)
"""


@pytest.fixture
def service(redis_server: RedisServer) -> Iterator[Gunicorn]:
    with redis_server.client() as client:
        client.flushall()
    server = Gunicorn(service_env(redis_server.url, TOKEN_SERVICE_ADMIN_KEYS=ADMIN_KEY), workers=1).start()
    yield server
    server.stop()


def _story(redis_server: RedisServer, workdir: Path) -> tuple[str, str]:
    """The records the page talks about; returns the token_refs of the stuck checkout and of
    one held by a hung request (its lease still running)."""
    with redis_server.client() as client:
        past = TokenStore(client, clock_ms=past_clock(120))
        [token] = past.issue(IssueRequest("checkout", "user-42", None, 900))
        past.begin(UseRequest(token, "checkout", "user-42", request_id="order-1138"), lease_seconds=30)
        now = TokenStore(client)
        [held] = now.issue(IssueRequest("checkout", "user-43", None, 900))
        now.begin(UseRequest(held, "checkout", "user-43", request_id="order-1139"), lease_seconds=300)
        claims = IdempotencyStore(client)
        key = claims.key("Bearer alice-api-token", "order-7")
        claims.begin(key, "fp", "owner-1", 60)
        claims.store(key, "fp", "owner-1", StoredResponse.json(201, {"order": 7}), 3600)
    engine = sa.create_engine(f"sqlite:///{workdir / 'shop.db'}")
    durable.create_records_table(engine)
    with engine.begin() as conn:
        durable.claim(
            conn,
            "token:order-77",
            lease_seconds=30,
            clock=lambda: durable.utc_now() - timedelta(seconds=120),
        )
    engine.dispose()
    (workdir / "payments.py").write_text(PAYMENTS)
    return token_digest(token), token_digest(held)


@pytest.mark.slow
def test_every_block_of_the_operations_page_runs(
    service: Gunicorn, redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_ref, held_ref = _story(redis_server, tmp_path)
    env = shell_env(
        TOKEN_SERVICE_REDIS_URL=redis_server.url,
        TOKEN_REF=token_ref,
        HELD_REF=held_ref,
        ADMIN_KEY=ADMIN_KEY,
        PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    )
    blocks = code_blocks(PAGE)
    assert [block.lang for block in blocks] == [*["sh"] * 6, "python", "sh", "sh", "python", *["sh"] * 4]
    ran = 0
    for block in blocks:
        if block.lang == "sh":
            run_sh(block, service.url, env)
        elif "def decide(stuck):" in block.code:
            # the completer module: the next block's `--handler completer:decide` imports it
            (tmp_path / "completer.py").write_text(block.code)
        else:
            monkeypatch.chdir(tmp_path)  # the block's sqlite:///shop.db
            monkeypatch.syspath_prepend(str(tmp_path))
            import payments  # type: ignore[import-not-found]

            run_python(block, {"payments": payments})
            sys.modules.pop("payments", None)
        ran += 1
    assert ran == len(blocks)

    with redis_server.client() as client:
        assert client.exists(f"ts:t:{token_ref}") == 0  # revoked by the last HTTP block
        assert client.get(f"ts:t:{held_ref}").startswith(b"I")  # released: ISSUED again
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'shop.db'}")
    with engine.connect() as conn:
        row = conn.execute(sa.select(IDEMPOTENCY_RECORDS)).one()
    engine.dispose()
    assert row.status == "SUCCEEDED"


def test_the_page_names_every_admin_command_and_alert() -> None:
    text = (REPO_ROOT / PAGE).read_text()
    for word in ("admin show", "admin find", "admin list", "admin revoke", "admin release", "reconcile"):
        assert word in text, word
    for alert in (
        "TokenServiceStoreErrors",
        "TokenServiceNotReady",
        "TokenServiceDown",
        "TokenServiceDuplicateSpike",
        "TokenServiceLeaseLost",
        "TokenServiceRateLimited",
    ):
        assert alert in text, alert
