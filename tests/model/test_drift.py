"""The Spin model (lua/model/lease.pml) and the Lua scripts it models hold the same states and
the same transitions, so neither can change without the other (no spin needed here).

Each script that touches a token record says what it does to it on a ``-- transitions:`` line
(``I->C P->C P->0``; 0 is no record); the model's table is every ``MOVE(SCRIPT, from, to)`` it
makes, which Spin itself checks against the state the record is in. The two tables must be
equal, every letter a script writes must be on its line (and every letter its line moves to
must be written), and the letters the scripts write, compare, name (inspect.lua, _record.lua)
and the admin tools show are exactly the model's states.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT
from token_service.ops import admin

LUA = REPO_ROOT / "lua"
MODEL = LUA / "model" / "lease.pml"

# The scripts of other records, which the model does not describe: the clients' issuance limits
# (admit, release). (An Idempotency-Key's record is a keyed operation's: the model's, -DKEYED.)
OTHER_RECORDS = frozenset({"admit", "release"})

Table = dict[str, set[tuple[str, str]]]

# What the model's steps that are no script do to a record: the keyed claim, store.py's one
# plain SET NX GET PX (TokenStore._claim), which only ever creates a PROCESSING record.
PLAIN_COMMANDS: Table = {"claim": {("0", "P")}}

_TRANSITIONS = re.compile(r"^-- transitions: (.*)$", re.MULTILINE)
_MOVE = re.compile(r"([A-Z0])->([A-Z0])")
_MODEL_MOVE = re.compile(r"\bMOVE\((\w+), (\w+), (\w+)\)")
_MODEL_STATE = re.compile(r"^#define (\w+) (\d+)(?: /\* (\w+) \*/)?$", re.MULTILINE)
_MODEL_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)
_COMMENT = re.compile(r"--[^\n]*")
# a record's letter where the code builds a value: record('C', ...) or 'C' .. fields
_WRITTEN = re.compile(r"record\('([A-Z])'|'([A-Z])' \.\.")
_COMPARED = re.compile(r"state [~=]= '([A-Z])'")
_COMPARED_BYTE = re.compile(r"string\.byte\(value\) == (\d+)")


def lua_tables(lua: Path) -> tuple[Table, list[str]]:
    """Each token-record script's declared moves, and the scripts that declare none."""
    tables: Table = {}
    undeclared = []
    for path in sorted(lua.glob("*.lua")):
        name = path.stem
        if name.startswith("_") or name in OTHER_RECORDS:
            continue
        lines = _TRANSITIONS.findall(path.read_text(encoding="utf-8"))
        if len(lines) != 1:
            undeclared.append(name)
            continue
        tables[name] = set(_MOVE.findall(lines[0]))
    return tables, undeclared


def model_states(model: Path) -> dict[str, str]:
    """The model's state letters, with their names (NONE, the absent record, is not one)."""
    return {
        letter: name
        for letter, code, name in _MODEL_STATE.findall(model.read_text(encoding="utf-8"))
        if name and len(letter) == 1 and chr(int(code)) == letter
    }


def model_table(model: Path) -> Table:
    """The moves the model makes, by script (the clock's EXPIRE is Redis's, no script's)."""
    table: Table = {}
    code = _MODEL_COMMENT.sub("", model.read_text(encoding="utf-8"))
    for line in code.splitlines():
        if line.startswith("#define MOVE"):
            continue
        for script, before, after in _MODEL_MOVE.findall(line):
            if script == "EXPIRE":
                continue
            move = (before.replace("NONE", "0"), after.replace("NONE", "0"))
            table.setdefault(script.lower(), set()).add(move)
    return table


def written(source: str) -> set[str]:
    """The letters a script's code builds records with ('0': it deletes one)."""
    code = _COMMENT.sub("", source)
    letters = {a or b for a, b in _WRITTEN.findall(code)}
    if "redis.call('DEL'" in code:
        letters.add("0")
    return letters


def compared(source: str) -> set[str]:
    code = _COMMENT.sub("", source)
    return set(_COMPARED.findall(code)) | {chr(int(byte)) for byte in _COMPARED_BYTE.findall(code)}


def drift(lua: Path, model: Path) -> list[str]:
    """Every way the scripts in ``lua`` and the model differ; [] when they agree."""
    problems: list[str] = []
    tables, undeclared = lua_tables(lua)
    problems += [f"{name}.lua has no single '-- transitions:' line" for name in undeclared]
    declared_all = {**tables, **PLAIN_COMMANDS}
    modelled = model_table(model)
    for name in sorted(set(declared_all) | set(modelled)):
        declared, made = declared_all.get(name, set()), modelled.get(name, set())
        if declared != made:
            problems.append(f"{name}: the script declares {sorted(declared)}, the model makes {sorted(made)}")
    states = model_states(model)
    letters = set(states)
    all_written: set[str] = set()
    for name, moves in tables.items():
        source = (lua / f"{name}.lua").read_text(encoding="utf-8")
        builds = written(source)
        all_written |= builds - {"0"}
        on_line = {letter for move in moves for letter in move}
        targets = {after for _, after in moves}
        if builds - on_line:
            problems.append(f"{name}.lua writes {sorted(builds - on_line)}, not on its transitions line")
        if targets - builds:
            never = sorted(targets - builds)
            problems.append(f"{name}.lua's transitions move to {never}, which it never writes")
        unknown = sorted(compared(source) - letters)
        if unknown:
            problems.append(f"{name}.lua compares states {unknown} the model lacks")
    if all_written != letters:
        problems.append(f"the scripts write states {sorted(all_written)}, the model has {sorted(letters)}")
    record_head = (lua / "_record.lua").read_text(encoding="utf-8")
    listed = re.search(r"^-- States: (.*)\.$", record_head, re.MULTILINE)
    named = dict(re.findall(r"(\w) (\w+)", listed.group(1))) if listed else {}
    if named != states:
        problems.append(f"_record.lua lists states {named}, the model {states}")
    inspect = (lua / "inspect.lua").read_text(encoding="utf-8")
    names_table = re.search(r"local names = \{(.*?)\}", inspect)
    shown = dict(re.findall(r"(\w) = '(\w+)'", names_table.group(1))) if names_table else {}
    if shown != states:
        problems.append(f"inspect.lua names states {shown}, the model {states}")
    if states != admin.TOKEN_STATES:
        problems.append(f"the admin tools show states {admin.TOKEN_STATES}, the model {states}")
    return problems


def test_the_scripts_and_the_model_agree() -> None:
    assert drift(LUA, MODEL) == []


def test_the_model_is_read() -> None:
    # the tables compared above are not empty by accident of a parser that matched nothing
    assert model_states(MODEL) == {
        "I": "ISSUED",
        "P": "PROCESSING",
        "C": "CONSUMED",
        "S": "SUCCEEDED",
        "F": "FAILED",
    }
    table = model_table(MODEL)
    assert set(table) == {"issue", "consume", "begin", "claim", "renew", "complete", "fail", "revoke"}
    assert table["claim"] == PLAIN_COMMANDS["claim"]
    assert ("P", "S") in table["complete"]
    tables, undeclared = lua_tables(LUA)
    assert undeclared == []
    assert tables["inspect"] == tables["admin_read"] == set()


@pytest.fixture
def copies(tmp_path: Path) -> tuple[Path, Path]:
    lua = tmp_path / "lua"
    shutil.copytree(LUA, lua)
    return lua, lua / "model" / "lease.pml"


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} is no longer in {path.name}: update this test"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def test_a_new_letter_written_by_a_script_is_drift(copies: tuple[Path, Path]) -> None:
    lua, model = copies
    _edit(
        lua / "fail.lua",
        "if ARGV[2] == '0' then",
        "if ARGV[2] == '2' then redis.call('SET', KEYS[1], record('X', {})) end\nif ARGV[2] == '0' then",
    )
    problems = drift(lua, model)
    assert "fail.lua writes ['X'], not on its transitions line" in problems
    assert "the scripts write states ['C', 'F', 'I', 'P', 'S', 'X'], the model has " in "".join(problems)


def test_a_new_move_declared_by_a_script_is_drift(copies: tuple[Path, Path]) -> None:
    lua, model = copies
    _edit(lua / "complete.lua", "-- transitions: P->S", "-- transitions: P->S I->S")
    assert drift(lua, model) == [
        "complete: the script declares [('I', 'S'), ('P', 'S')], the model makes [('P', 'S')]"
    ]


def test_a_move_the_model_drops_is_drift(copies: tuple[Path, Path]) -> None:
    lua, model = copies
    _edit(model, "MOVE(CONSUME, P, NONE)", "MOVE(EXPIRE, P, NONE)")
    assert drift(lua, model) == [
        "consume: the script declares [('I', 'C'), ('P', '0'), ('P', 'C')], "
        "the model makes [('I', 'C'), ('P', 'C')]"
    ]


def test_a_script_that_stops_writing_a_state_is_drift(copies: tuple[Path, Path]) -> None:
    lua, model = copies
    _edit(lua / "revoke.lua", "redis.call('DEL', KEYS[1])", "redis.call('UNLINK', KEYS[1])")
    assert drift(lua, model) == ["revoke.lua's transitions move to ['0'], which it never writes"]


def test_a_state_compared_that_the_model_lacks_is_drift(copies: tuple[Path, Path]) -> None:
    lua, model = copies
    _edit(lua / "begin.lua", "if state == 'S' then", "if state == 'S' or state == 'Z' then")
    assert drift(lua, model) == ["begin.lua compares states ['Z'] the model lacks"]


def test_a_new_script_must_say_what_it_does_to_a_record(copies: tuple[Path, Path]) -> None:
    lua, model = copies
    (lua / "extend.lua").write_text("local value = redis.call('GET', KEYS[1])\n", encoding="utf-8")
    assert drift(lua, model) == ["extend.lua has no single '-- transitions:' line"]
