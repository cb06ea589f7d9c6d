"""The Lua linker: each script of ``lua/`` as Redis runs it, with the helpers it calls.

``lua/_record.lua`` holds the helpers the token scripts share; Redis has no
``require``, so :func:`lua_source` prepends to a script the ones it calls (and
only those: a helper is a closure made on every run). :func:`admit_issue_source`
joins admit.lua and issue.lua into one script, a generate in one round trip.
The text is built once per process (``functools.cache``); Redis knows each
script by the SHA1 of that text.

Nothing here talks to Redis. Loading, running by SHA and loading again after
a ``NOSCRIPT`` are the job of the modules that run scripts:
:mod:`token_service.store` (its module docstring says where and why it does it
itself), and :mod:`token_service.client._idempotency_store` and
:mod:`token_service.ops.admin`, through redis-py's ``Script``, which reloads on
``NOSCRIPT`` (ops.admin's pipelined reads redo theirs themselves).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from token_service.resources import shipped

__all__ = ["ADMIT_ISSUE", "SCRIPT_NAMES", "admit_issue_source", "lua_dir", "lua_source"]

# The token operations' scripts (lua/<name>.lua), one per store operation
SCRIPT_NAMES = (
    "issue",
    "consume",
    "begin",
    "renew",
    "complete",
    "fail",
    "inspect",
    "revoke",
    "admit",
    "release",
)


def lua_dir() -> Path:
    """The scripts' directory (``lua/``, in the installed package or the checkout)."""
    return shipped("lua")


_HELPER_START = re.compile(r"^local function (\w+)", re.MULTILINE)
_LUA_COMMENT = re.compile(r"--[^\n]*")


def _record_helpers() -> tuple[str, dict[str, str]]:
    """_record.lua's head (its constants) and its helpers, by name, in their order."""
    text = (lua_dir() / "_record.lua").read_text(encoding="utf-8")
    starts = list(_HELPER_START.finditer(text))
    head = text[: starts[0].start()] if starts else text
    helpers = {
        match.group(1): text[match.start() : (starts[i + 1].start() if i + 1 < len(starts) else len(text))]
        for i, match in enumerate(starts)
    }
    return head, helpers


def _helpers_for(body: str) -> str:
    """The part of _record.lua a script needs: its constants and the helpers it calls.

    A script's helpers are created anew (one closure each) every time it runs,
    whether it calls them or not: those it never calls are left out. A helper
    is kept when its name is called in ``body`` or in a kept helper.
    """
    head, helpers = _record_helpers()
    return head + _defined(helpers, _needed(body, helpers))


def _needed(body: str, helpers: dict[str, str], known: frozenset[str] = frozenset()) -> set[str]:
    """The helpers ``body`` calls, with the helpers they call, except those ``known`` already."""
    needed: set[str] = set()
    pending = [body]
    while pending:
        source = _LUA_COMMENT.sub("", pending.pop())
        for name, helper in helpers.items():
            if name not in needed and name not in known and re.search(rf"\b{name}\(", source):
                needed.add(name)
                pending.append(helper)
    return needed


def _defined(helpers: dict[str, str], names: set[str]) -> str:
    """The definitions of the helpers ``names``, in _record.lua's order."""
    return "".join(helper for name, helper in helpers.items() if name in names)


# A script's line that says where the helpers only its later part calls are defined:
# a fast path above it does not pay for the closures of the slow path below.
_LATER_HELPERS = "-- (the helpers of the rest are defined here)\n"


def _with_helpers(body: str) -> str:
    early, marker, late = body.partition(_LATER_HELPERS)
    if not marker:
        return _helpers_for(body) + "\n" + body
    head, helpers = _record_helpers()
    first = _needed(early, helpers)
    later = _defined(helpers, _needed(late, helpers, frozenset(first)))
    return head + _defined(helpers, first) + "\n" + early + marker + later + late


@cache
def lua_source(name: str) -> str:
    """lua/<name>.lua with the part of _record.lua it calls, as Redis runs it (and hashes it)."""
    return _with_helpers((lua_dir() / f"{name}.lua").read_text(encoding="utf-8"))


ADMIT_ISSUE = "admit+issue"


_ISSUE_REFUSAL = "local refused = issue_refusal()\nif refused then return refused end\n"


@cache
def admit_issue_source() -> str:
    """admit.lua then issue.lua as one script: a generate in one round trip instead of two.

    KEYS[1..n-2] the token record keys, KEYS[n-1] the client's limit record,
    KEYS[n] the anonymous budget's (always named; read only when admit's ARGV ask
    for the budget); ARGV[1..5] issue's (ARGV[5], the bucket, is left '' and filled
    in with admit's reply), ARGV[6..] admit's. Returns issue's refusal of its
    arguments (before admit charges anything), admit's refusal, or issue's
    reply. Only for standalone Redis (and Sentinel): on Cluster the client's
    key and the token keys live in different slots.

    admit.lua becomes a function of the client's and the budget's keys that reads
    its arguments where they are (``ARGV[n]`` → ``ARGV[n + 5]``: no new KEYS and ARGV
    tables per call); issue.lua then runs as the script's tail, without its own check of
    its arguments (done first, before admit; the bucket admit puts in ARGV[5] is digits and
    slashes).
    """
    directory = lua_dir()
    admit = (directory / "admit.lua").read_text(encoding="utf-8")
    issue = (directory / "issue.lua").read_text(encoding="utf-8")
    code = _LUA_COMMENT.sub("", admit)
    if re.search(r"\bKEYS\b(?!\[[12]\])|\bARGV\b(?!\[\d+\])", code):
        raise RuntimeError("admit.lua reads KEYS or ARGV other than by a literal index")
    admit = re.sub(r"\bKEYS\[1\]", "client", admit)
    admit = re.sub(r"\bKEYS\[2\]", "budget", admit)
    admit = re.sub(r"\bARGV\[(\d+)\]", lambda m: f"ARGV[{int(m.group(1)) + 5}]", admit)
    if issue.count(_ISSUE_REFUSAL) != 1:
        raise RuntimeError("issue.lua no longer starts by checking its arguments with issue_refusal()")
    issue = issue.replace(_ISSUE_REFUSAL, "")
    return "\n".join(
        [
            _helpers_for(admit + issue + "issue_refusal()"),
            "local function admit_script(client, budget)",
            admit,
            "end",
            _ISSUE_REFUSAL,
            "if #KEYS < 3 then return {'invalid_argument', 'KEYS: the tokens, the client, the budget'} end",
            "local admitted = admit_script(KEYS[#KEYS - 1], KEYS[#KEYS])",
            "if admitted[1] ~= 'admitted' then return admitted end",
            "KEYS[#KEYS] = nil",
            "KEYS[#KEYS] = nil",
            "ARGV[5] = admitted[2]",
            issue,
        ]
    )
