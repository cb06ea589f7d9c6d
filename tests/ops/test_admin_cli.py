"""``token-service admin …`` as an operator runs it, against a real redis-server (and a Cluster)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.ops.clock import past_clock
from tests.support.processes import REPO_ROOT
from tests.support.topologies import ClusterTopology, Standalone
from token_service.records import IssueRequest, UseRequest
from token_service.server.admin_cli import dashed_refs_last
from token_service.store import TokenStore
from token_service.tokens import token_digest

# slow: each test runs the admin CLI as processes, on standalone and a cluster (~125 s)
pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "token_service.server.cli", "admin"]
PAY = IssueRequest("pay", "user-7", None, 600)


def admin_cli(
    url: str, *args: str, stdin: str = "", cwd: Path = REPO_ROOT
) -> tuple[int, list[dict[str, Any]], list[dict[str, Any]]]:
    """Exit status, the JSON lines of stdout, and the JSON audit lines of stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKEN_SERVICE_")}
    env["TOKEN_SERVICE_REDIS_URL"] = url
    env["PYTHONPATH"] = str(REPO_ROOT)
    done = subprocess.run(
        [*CLI, *args], env=env, input=stdin, capture_output=True, text=True, timeout=120, cwd=cwd
    )
    if done.returncode not in (0, 1, 2) or "Traceback" in done.stderr:
        raise AssertionError(done.stderr)
    if done.returncode == 2:
        print(done.stderr)  # shown when the test fails
    out = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    err = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    return done.returncode, out, err


@pytest.fixture(params=["standalone", "cluster"])
def topology(request: pytest.FixtureRequest) -> Standalone | ClusterTopology:
    found: Standalone | ClusterTopology = request.getfixturevalue(f"ops_{request.param}")
    found.flush()
    return found


@pytest.fixture
def client(topology: Any) -> Any:
    opened = topology.client()
    yield opened
    opened.close()


def test_show_revoke_and_release(topology: Any, client: Any) -> None:
    store = TokenStore(client)
    held, issued = store.issue(PAY, 2)
    store.begin(UseRequest(held, "pay", "user-7", request_id="order-5"), lease_seconds=600)

    status, out, audit = admin_cli(topology.url, "show", token_digest(held))
    assert status == 0
    assert out[0]["state"] == "PROCESSING"
    assert out[0]["request_id"] == "order-5"
    assert [(line["action"], line["outcome"]) for line in audit] == [("show", "found")]
    assert audit[0]["actor"].startswith("cli:")

    status, out, _ = admin_cli(topology.url, "release", token_digest(held))
    assert (status, out) == (0, [{"outcome": "released", "ref": token_digest(held)}])
    status, out, _ = admin_cli(topology.url, "release", token_digest(issued))
    assert status == 1
    assert out[0]["outcome"] == "not_in_progress"

    status, out, _ = admin_cli(topology.url, "revoke", token_digest(issued))
    assert status == 0
    assert out[0]["outcome"] == "revoked"
    status, out, _ = admin_cli(topology.url, "show", token_digest(issued))
    assert status == 1
    assert out[0]["outcome"] == "not_found"


def test_a_ref_that_starts_with_a_dash_is_a_ref_not_an_option(topology: Any, client: Any) -> None:
    """One ref in 64 starts with '-' (base64url); argparse took it for an option and the
    command failed with "the following arguments are required: ref" (a CI run hit it)."""
    store = TokenStore(client)
    dashed = [t for t in store.issue(PAY, 1000) if token_digest(t).startswith("-")][:2]
    assert len(dashed) == 2  # 1000 draws: missing both is a 1-in-10^5 event
    held, issued = dashed
    store.begin(UseRequest(held, "pay", "user-7", request_id="order-6"), lease_seconds=600)

    status, out, _ = admin_cli(topology.url, "show", token_digest(held))
    assert (status, out[0]["state"]) == (0, "PROCESSING")
    status, out, _ = admin_cli(topology.url, "release", token_digest(held), "--kind", "token")
    assert (status, out) == (0, [{"outcome": "released", "ref": token_digest(held)}])
    status, out, _ = admin_cli(topology.url, "revoke", "--kind", "token", token_digest(issued))
    assert (status, out[0]["outcome"]) == (0, "revoked")
    status, out, _ = admin_cli(topology.url, "show", token_digest(held)[:8])  # a short prefix searches
    assert status == 0
    assert token_digest(held) in [record["ref"] for record in out]


def test_dashed_refs_go_behind_a_double_dash_and_nothing_else_moves() -> None:
    moved = dashed_refs_last(["admin", "release", "-abcdefghijklmnopqrstu", "--kind", "token"])
    assert moved == ["admin", "release", "--kind", "token", "--", "-abcdefghijklmnopqrstu"]
    moved = dashed_refs_last(["admin", "show", "--kind=token", "--count", "50", "--bcdefghijklmnopqrstu"])
    assert moved == ["admin", "show", "--kind=token", "--count", "50", "--", "--bcdefghijklmnopqrstu"]
    untouched = [
        ["admin", "release", "abcdefghijklmnopqrstu"],
        ["admin", "show", "--idempotency-key", "-abcdef", "--identity", "x"],  # an option's value
        ["admin", "list", "--scope", "-abcdef"],
        ["admin", "show", "-h"],
        ["admin", "revoke", "--", "-abcdefghijklmnopqrstu"],
        ["serve", "--port", "8000"],
    ]
    for argv in untouched:
        assert dashed_refs_last(argv) == argv


def test_list_and_find(topology: Any, client: Any) -> None:
    store = TokenStore(client)
    tokens = store.issue(PAY, 25)
    for token in tokens[:7]:
        store.consume(UseRequest(token, "pay", "user-7"))
    store.consume(UseRequest(tokens[21], "pay", "user-7", request_id="checkout-99"))

    status, out, _ = admin_cli(topology.url, "list", "--state", "CONSUMED", "--scope", "pay", "--count", "5")
    assert status == 0
    *records, end = out
    assert sorted(r["ref"] for r in records) == sorted(token_digest(t) for t in [*tokens[:7], tokens[21]])
    assert end["done"] is True

    status, out, _ = admin_cli(topology.url, "list", "--state", "ISSUED", "--limit", "3", "--count", "2")
    *records, end = out
    assert 3 <= len(records) < 17
    assert end["done"] is False  # go on with --cursor
    status, out, _ = admin_cli(topology.url, "list", "--state", "ISSUED", "--cursor", end["cursor"])
    assert len(records) + len(out[:-1]) == 17

    status, out, _ = admin_cli(topology.url, "find", "--request-id", "checkout-99")
    assert status == 0
    assert [r["ref"] for r in out] == [token_digest(tokens[21])]
    status, out, _ = admin_cli(topology.url, "show", token_digest(tokens[21])[:8])
    assert [r["ref"] for r in out] == [token_digest(tokens[21])]


def test_idempotency_identity_is_read_from_stdin(topology: Any, client: Any) -> None:
    from token_service.client._idempotency_store import IdempotencyStore

    claims = IdempotencyStore(client)
    claims.begin(claims.key("Bearer carol-credential", "k-1"), "fp", "owner", 600)
    status, out, audit = admin_cli(
        topology.url, "show", "--idempotency-key", "k-1", "--identity", "-", stdin="Bearer carol-credential\n"
    )
    assert status == 0
    assert out[0]["kind"] == "idempotency"
    assert out[0]["state"] == "PROCESSING"
    assert "carol-credential" not in json.dumps(audit)
    assert "k-1" not in json.dumps([line.get("ref") for line in audit])


def test_a_short_ref_finds_records_of_either_kind_and_says_when_none(topology: Any, client: Any) -> None:
    """A short ref found only token records, and one that matched nothing printed nothing (exit 1)."""
    from token_service.client._idempotency_store import IdempotencyStore

    claims = IdempotencyStore(client)
    claim = claims.key("Bearer dave-credential", "k-2")
    claims.begin(claim, "fp", "owner", 600)
    [key] = [key.decode() for key in client.keys("*:ik:*")]
    ref = key.rsplit(":", 1)[1]
    status, out, _ = admin_cli(topology.url, "show", ref[:8])
    assert status == 0
    assert [(record["kind"], record["ref"]) for record in out] == [("idempotency", ref)]
    status, out, _ = admin_cli(topology.url, "show", ref[:8], "--kind", "token")
    assert (status, [line["outcome"] for line in out]) == (1, ["not_found"])
    status, out, audit = admin_cli(topology.url, "show", "ZZZZZZZZ")
    assert status == 1
    assert out == [{"outcome": "not_found", "detail": out[0]["detail"]}]
    assert "ZZZZZZZZ" in out[0]["detail"]
    assert [(line["action"], line["outcome"]) for line in audit] == [("find_by_ref_prefix", "0 found")]


def test_reconcile_with_a_handler_module(topology: Any, client: Any, tmp_path: Path) -> None:
    past = TokenStore(client, clock_ms=past_clock(30))
    [token] = past.issue(PAY, 1)
    past.begin(UseRequest(token, "pay", "user-7", request_id="order-77"), lease_seconds=1)
    (tmp_path / "completer.py").write_text(
        "from token_service.ops.reconcile import Complete\n"
        "def decide(stuck):\n"
        "    return Complete({'order': stuck.request_id, 'recovered': True})\n"
    )
    status, out, _ = admin_cli(topology.url, "reconcile", "--dry-run", cwd=tmp_path)
    assert status == 0
    assert out[0]["action"] == "dry_run"
    assert out[0]["request_id"] == "order-77"
    status, out, audit = admin_cli(topology.url, "reconcile", "--handler", "completer:decide", cwd=tmp_path)
    assert status == 0
    assert (out[0]["action"], out[0]["outcome"]) == ("complete", "succeeded")
    assert audit[-1]["action"] == "reconcile"
    status, out, _ = admin_cli(topology.url, "show", token_digest(token))
    assert out[0]["result"] == {"order": "order-77", "recovered": True}


def test_usage_errors_exit_2_without_a_traceback(ops_standalone: Standalone) -> None:
    for args in (
        ["show"],
        ["show", "*"],
        ["reconcile", "--handler", "nope"],
        ["list", "--cursor", "zz"],
        ["list", "--cursor", "²"],
        ["list", "--cursor", "0.²"],
        ["list", "--cursor", "0.99999999999999999999999"],
        ["list", "--count", "²"],
        ["list", "--count", "9" * 5000],  # past int()'s 4300-digit limit
        ["list", "--limit", "-1"],
        ["reconcile", "--dry-run", "--lease-seconds", "0" * 5000 + "1"],
        ["show", "--idempotency-key", "k", "--identity", "a\x01b"],
        ["show", "--idempotency-key", "k", "--identity", os.fsdecode(b"\xff")],  # argv not UTF-8
    ):
        status, _, audited = admin_cli(ops_standalone.url, *args)
        assert status == 2, args
        # refused once it reached the store's tools (a bad ref, cursor or identity): one audit line
        assert [line["outcome"] for line in audited] in ([], ["refused"]), (args, audited)
    _, _, audited = admin_cli(ops_standalone.url, "show", "*")
    assert [(line["action"], line["ref"], line["fields"]) for line in audited] == [("show", None, ["ref"])]
    # an identity on stdin that is not UTF-8
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKEN_SERVICE_")}
    done = subprocess.run(
        [*CLI, "show", "--idempotency-key", "k", "--identity", "-"],
        env={**env, "TOKEN_SERVICE_REDIS_URL": ops_standalone.url, "PYTHONPATH": str(REPO_ROOT)},
        input=b"\xed\xa0\x80\n",
        capture_output=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 2, done.stderr
    assert b"Traceback" not in done.stderr
    # one line saying what was wrong, and the refusal's audit line (JSON)
    said = [line for line in done.stderr.strip().splitlines() if not line.startswith(b"{")]
    assert len(said) == 1, done.stderr
    [audited] = [json.loads(line) for line in done.stderr.splitlines() if line.startswith(b"{")]
    assert (audited["outcome"], audited["action"], audited["fields"]) == ("refused", "show", ["identity"])
    done = subprocess.run(
        [*CLI, "list"],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 2
    assert "TOKEN_SERVICE_REDIS_URL" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_unknown_setting_is_refused_naming_the_closest_one(ops_standalone: Standalone) -> None:
    # a typo would otherwise leave a default in force (serve and check refuse it the same way)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKEN_SERVICE_")}
    env.update(
        TOKEN_SERVICE_REDIS_URL=ops_standalone.url,
        TOKEN_SERVICE_KEY_PREFX="other:",
        PYTHONPATH=str(REPO_ROOT),
    )
    done = subprocess.run([*CLI, "list"], env=env, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 2, done.stderr
    assert "TOKEN_SERVICE_KEY_PREFX: not a setting of token-service" in done.stderr
    assert "did you mean TOKEN_SERVICE_KEY_PREFIX?" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
