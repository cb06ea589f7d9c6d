"""The model's scripts are the Lua scripts: from every state of a record, each script of
lua/model/lease.pml (run by Spin, one step) and the same script of lua/ (run by a real
redis-server, time given as now_ms) answer the same and leave the same record behind.

The drift test holds the two transition tables together; this holds the conditions under
which each transition is taken (a lease-id check, an expiry) together too: a script that
stopped checking its lease id would pass the drift test and fail here.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.spin import MODEL, tool
from token_service.records import read_record
from token_service.scripts import lua_source

SEP = "\x1f"
NOW_MS = 10_000_000
KEY = "ts:t:conformance"
# request ids and lease ids as the model numbers them: 1 is the calling guard's, 2 another's;
# 3 is the lease a begin draws
REQUESTS = {0: "", 1: "r1", 2: "r2"}
LEASES = {0: "", 1: "L1", 2: "L2", 3: "L3"}


@dataclass(frozen=True)
class Record:
    """A record as the model sees it: state letter ('0': none), request, lease, and whether
    the lease and the token's own expiry are still ahead."""

    st: str
    req: int = 0
    lease: int = 0
    lease_live: bool = False
    tok_live: bool = False


def states() -> list[Record]:
    found = [Record("0")]
    found += [Record("I", 0, lease, False, True) for lease in (0, 1, 2)]  # lease: a released one
    found += [Record("C", req, 0, False, True) for req in (1, 2)]
    found += [
        Record("P", req, lease, lease_live, tok_live)
        for req, lease, lease_live, tok_live in itertools.product(
            (1, 2), (1, 2), (False, True), (False, True)
        )
    ]
    found += [Record(st, req, lease, False, True) for st in "SF" for req in (1, 2) for lease in (1, 2)]
    return found


# (name, the model's call of guard 1 / request 1, the script and its ARGV)
CALLS: list[tuple[str, str, str, list[str]]] = [
    ("consume by request 1", "lua_consume(1, r)", "consume", ["s", "", "", "r1", str(NOW_MS)]),
    ("consume by request 2", "lua_consume(2, r)", "consume", ["s", "", "", "r2", str(NOW_MS)]),
    ("begin", "lua_begin(1, r, out)", "begin", ["s", "", "", "r1", "1000", "L3", str(NOW_MS)]),
    ("renew", "lua_renew(1, 1, r)", "renew", ["L1", "1000", str(NOW_MS)]),
    ("complete", "lua_complete(1, 1, r)", "complete", ["L1", '{"ok": 1}', "60000", str(NOW_MS)]),
    ("fail retryable", "lua_fail(1, 1, true, r)", "fail", ["L1", "1", "{}", "60000", str(NOW_MS)]),
    ("fail terminal", "lua_fail(1, 1, false, r)", "fail", ["L1", "0", '{"e": 1}', "60000", str(NOW_MS)]),
    ("revoke", "lua_revoke()", "revoke", []),
]
KEYED_BEGIN = (
    "begin",
    "lua_begin(1, r, out)",
    "begin",
    ["s", "", "", "r1", "1000", "L3", str(NOW_MS), "5000"],
)

# slow: Spin and a real redis-server run every script from every state (~25 s)
pytestmark = [pytest.mark.real, pytest.mark.slow]

_LETTER = {"0": "NONE", "I": "I", "P": "P", "C": "C", "S": "S", "F": "F"}

HARNESS = """#define STEP
#include "lease.pml"

inline setup() {
  lid[1] = 1; lid[2] = 2; next_lease = 2; issued = true;
  valid[1] = (st == P && lease == 1 && lease_live);
  valid[2] = (st == P && lease == 2 && lease_live);
  if
  :: st == C || st == S || st == F -> recorded = 1
  :: else -> recorded = 0
  fi;
  r = R_NONE; out = 0
}

init {
  mtype:reply r = R_NONE;
  byte out = 0;
%s
}
"""


def _model_answers(work: Path, cases: list[tuple[Record, str]], keyed: bool) -> list[str]:
    """Spin's answer to each case: reply, then the record after it, as 'case' lines print them."""
    steps = []
    for number, (before, call) in enumerate(cases):
        if call == "lua_revoke()" and before.st == "0":
            continue
        steps.append(
            f"  st = {_LETTER[before.st]}; req = {before.req}; lease = {before.lease}; "
            f"lease_live = {int(before.lease_live)}; tok_live = {int(before.tok_live)}; setup();\n"
            f"  {call};\n"
            f'  printf("case {number} %e %c %d %d %d %d %d\\n",\n'
            "         r, st, req, lease, lease_live, tok_live, out);"
        )
    work.mkdir(parents=True, exist_ok=True)
    shutil.copy(MODEL, work / MODEL.name)
    (work / "step.pml").write_text(HARNESS % "\n".join(steps), encoding="utf-8")
    done = subprocess.run(
        [tool("spin"), "-T", *(["-DKEYED"] if keyed else []), "step.pml"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "assertion violated" not in done.stdout, done.stdout
    answers = [""] * len(cases)
    for line in done.stdout.splitlines():
        if found := re.match(r"case (\d+) (.*)$", line.strip()):
            answers[int(found.group(1))] = found.group(2)
    return answers


def _value(record: Record, layout: str) -> str | None:
    """The record as the scripts of this release write it ("headed": PROCESSING, SUCCEEDED and
    FAILED with the lease header first), or as those before it did ("first": a record left by
    an upgrade, which every script must read as it is)."""
    if record.st == "0":
        return None
    lease_ms = NOW_MS + 5000 if record.lease_live else NOW_MS - 5000
    token_ms = NOW_MS + 50000 if record.tok_live else NOW_MS - 2000
    request, lease = REQUESTS[record.req], LEASES[record.lease]
    if layout == "headed" and record.st in "PSF":
        times = [str(lease_ms), str(token_ms)] if record.st == "P" else ["", ""]
        head = record.st + "\x1e" + SEP.join([lease, *times, request, "s", "", ""])
        return head if record.st == "P" else head + SEP + "{}"
    fields = ["s", "", "", request, lease, "", "", ""]
    if record.st == "P":
        fields[5:7] = [str(lease_ms), str(token_ms)]
    if record.st in "SF":
        fields[7] = "{}"
    while fields and fields[-1] == "":
        fields.pop()
    return record.st + SEP.join(fields)


def _lua_answer(client: redis.Redis, record: Record, script: str, args: list[str], layout: str) -> str:
    client.delete(KEY)
    value = _value(record, layout)
    if value is not None:
        # the key's own TTL is real time, long; the scripts decide by now_ms
        client.set(KEY, value, px=600_000)
    reply: Any = client.register_script(lua_source(script))(keys=[KEY], args=args)
    if reply == 0 and script == "complete":  # complete.lua's usual answer: stored
        reply = [b"succeeded", 0]
    elif isinstance(reply, int):  # begin.lua's usual start: the lease it was given (ARGV[6])
        reply = [b"started", args[5].encode()]
    elif isinstance(reply, bytes):  # begin.lua's usual replay: the stored result
        reply = [b"succeeded", reply]
    code = reply[0].decode()
    replayed = len(reply) > 1 and reply[1] == 1
    out = 0
    if code == "started":
        out = {v: k for k, v in LEASES.items()}[reply[1].decode()]
    answer = {
        "token_invalid": "R_INVALID",
        "token_used": "R_USED",
        "token_failed": "R_FAILED",
        "token_in_progress": "R_IN_PROGRESS",
        "consumed": "R_CONSUMED_AGAIN" if replayed else "R_CONSUMED",
        "started": "R_STARTED",
        "succeeded": "R_SUCCEEDED_AGAIN" if script == "complete" and replayed else "R_SUCCEEDED",
        "renewed": "R_RENEWED",
        "lease_lost": "R_LEASE_LOST",
        "released": "R_RELEASED_AGAIN" if replayed else "R_RELEASED",
        "failed": "R_FAILED_AGAIN" if replayed else "R_FAILED",
        "revoked": "R_NONE",
    }[code]
    after = _after(client.get(KEY))
    tok_live = int(after.tok_live)
    return f"{answer} {after.st} {after.req} {after.lease} {int(after.lease_live)} {tok_live} {out}"


def _after(raw: bytes | None) -> Record:
    if raw is None:
        return Record("0")
    found = read_record(raw)  # the one reader of the record (token_service/records.py)
    req = {v: k for k, v in REQUESTS.items()}[found.request_id]
    lease = {v: k for k, v in LEASES.items()}[found.lease_id]
    if found.state == "P":
        assert found.lease_expires_ms is not None
        assert found.token_expires_ms is not None
        return Record("P", req, lease, found.lease_expires_ms > NOW_MS, found.token_expires_ms > NOW_MS)
    return Record(found.state, req, lease, False, found.state in "IC")


def _compare(model: str, lua: str) -> bool:
    # the model keeps a token's own expiry past its finish and its deletion; a finished or
    # deleted record in Redis has none to read
    if lua.split()[1] in "0SF":
        return model.split()[:5] + model.split()[6:] == lua.split()[:5] + lua.split()[6:]
    return model == lua


@pytest.mark.parametrize("layout", ["headed", "first"])
@pytest.mark.parametrize("keyed", [False, True], ids=["token", "keyed"])
def test_each_script_of_the_model_does_what_the_lua_does(
    tmp_path: Path, real_redis: redis.Redis, keyed: bool, layout: str
) -> None:
    calls = [KEYED_BEGIN] if keyed else CALLS
    cases = [(record, call) for record in states() for _, call, _, _ in calls]
    scripts = [(name, script, args) for _ in states() for name, _, script, args in calls]
    answers = _model_answers(tmp_path, cases, keyed)
    differ = []
    compared = 0
    for (record, _call), (name, script, args), model in zip(cases, scripts, answers, strict=True):
        if not model:  # revoke of no record: the model's operator never calls it
            continue
        lua = _lua_answer(real_redis, record, script, args, layout)
        compared += 1
        if not _compare(model, lua):
            differ.append(f"{name} from {record}: model {model!r}, lua {lua!r}")
    assert differ == []
    assert compared == len(cases) - (0 if keyed else 1)
