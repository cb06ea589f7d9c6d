"""The lease protocol, model-checked: Spin searches every interleaving of lua/model/lease.pml
(a holder, a duplicate, a consumer, expiries at any point) exhaustively and finds no violation
of its assertions nor of its LTL claim; a deliberately broken protocol is refuted with a trail.

Each search prints the states it explored and its time (``pytest -s`` shows them).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.spin import MODEL, tool

# deep enough for every configuration (the deepest path is under 200 steps); a search that
# needs more says "max search depth too small", which fails the test
DEPTH = "-m10000"
# minutes on a loaded machine are still far below this: the searches take seconds of CPU
SEARCH_TIMEOUT_SECONDS = 600

pytestmark = pytest.mark.slow


@dataclass
class Search:
    output: str
    states: int
    seconds: float
    work: Path
    pan: Path


def _search(work: Path, defines: list[str], cc_flags: list[str], pan_args: list[str]) -> Search:
    """spin -a, pan compiled with gcc, then the search; its output, states and time."""
    spin, gcc = tool("spin"), tool("gcc")
    work.mkdir(parents=True, exist_ok=True)
    shutil.copy(MODEL, work / MODEL.name)

    def run(*command: str) -> str:
        done = subprocess.run(
            command, cwd=work, capture_output=True, text=True, timeout=SEARCH_TIMEOUT_SECONDS
        )
        assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    run(spin, "-a", *defines, MODEL.name)
    # -O0: compiling pan optimised costs more CPU than the searches it would speed up; -w:
    # gcc's warnings about spin's generated code are not this project's
    run(gcc, "-w", "-O0", "-DCOLLAPSE", *cc_flags, "-o", "pan", "pan.c")
    started = time.monotonic()
    done = subprocess.run(
        ["./pan", DEPTH, *pan_args], cwd=work, capture_output=True, text=True, timeout=SEARCH_TIMEOUT_SECONDS
    )
    seconds = time.monotonic() - started
    stored = re.search(r"^\s*(\d+) states, stored", done.stdout, re.MULTILINE)
    assert stored is not None, done.stdout + done.stderr
    return Search(done.stdout, int(stored.group(1)), seconds, work, work / "pan")


def _errors(search: Search) -> int:
    found = re.search(r"errors: (\d+)", search.output)
    assert found is not None, search.output
    return int(found.group(1))


def _assert_complete(search: Search) -> None:
    assert _errors(search) == 0, search.output
    assert "Full statespace search" in search.output, search.output  # not a bitstate approximation
    assert "max search depth too small" not in search.output, search.output
    assert "Search not completed" not in search.output, search.output


CONFIGURATIONS = {"token": [], "keyed": ["-DKEYED"]}


@pytest.fixture(scope="module")
def safety(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Search]:
    """The assertions and the end states, every interleaving, per configuration."""
    return {
        name: _search(tmp_path_factory.mktemp(f"safety-{name}"), defines, ["-DNOCLAIM"], [])
        for name, defines in CONFIGURATIONS.items()
    }


@pytest.mark.parametrize("configuration", sorted(CONFIGURATIONS))
def test_no_interleaving_breaks_an_assertion(safety: dict[str, Search], configuration: str) -> None:
    search = safety[configuration]
    _assert_complete(search)
    assert re.search(r"invalid end states\s+\+", search.output), search.output
    print(f"\n{configuration}: {search.states} states, {search.seconds:.1f} s (safety)")


@pytest.mark.parametrize("configuration", sorted(CONFIGURATIONS))
def test_the_ltl_claim_holds(tmp_path: Path, configuration: str) -> None:
    search = _search(tmp_path / "ltl", CONFIGURATIONS[configuration], [], ["-a", "-N", "terminal"])
    _assert_complete(search)
    assert re.search(r"never claim\s+\+ \(terminal\)", search.output), search.output
    assert re.search(r"acceptance\s+cycles\s+\+", search.output), search.output
    print(f"\n{configuration}: {search.states} states, {search.seconds:.1f} s (LTL terminal)")


_STATE_LINE = re.compile(r"^\s*state\s+(\d+) -\(tr\s+\d+\)-> state\s+\d+ .*?lease\.pml:(\d+) ")
_UNREACHED = re.compile(r"^\s*lease\.pml:(\d+), state (\d+),")


def _reached_lines(search: Search) -> set[int]:
    """The model's lines some step of the search executed: ``pan -d -d`` lists every step (as
    compiled, before statement merging), the search the ones it never reached."""
    listing = subprocess.run(
        [str(search.pan), "-d", "-d"], cwd=search.work, capture_output=True, text=True, timeout=60
    ).stdout
    steps: set[tuple[str, int, int]] = set()
    proctype = ""
    for line in listing.splitlines():
        if line.startswith("STEP 3 "):
            proctype = line.split()[-1]
        elif found := _STATE_LINE.match(line):
            steps.add((proctype, int(found.group(1)), int(found.group(2))))
    assert steps, listing
    unreached: set[tuple[str, int]] = set()
    for line in search.output.splitlines():
        if line.startswith("unreached in "):  # "... proctype Guard", "... init", "... claim terminal"
            proctype = line.split()[-1]
            proctype = ":init:" if proctype == "init" else proctype
        elif found := _UNREACHED.match(line):
            unreached.add((proctype, int(found.group(2))))
    return {number for proctype, state, number in steps if (proctype, state) not in unreached}


def test_every_transition_of_the_table_is_taken(safety: dict[str, Search]) -> None:
    # a MOVE no interleaving reaches would be a transition the check says nothing about
    token, keyed = _reached_lines(safety["token"]), _reached_lines(safety["keyed"])
    reached = token | keyed
    lines = MODEL.read_text(encoding="utf-8").splitlines()
    [claim] = [number for number, line in enumerate(lines, 1) if "MOVE(BEGIN, NONE, P)" in line]
    # only a keyed operation claims an absent record: what is reached is told apart
    assert claim in keyed
    assert claim not in token
    moves = {
        number: line.strip()
        for number, line in enumerate(lines, 1)
        if "MOVE(" in line and not line.startswith("#define")
    }
    mutant_only = set()
    inside_mutant = False
    for number, line in enumerate(lines, 1):
        if line.startswith("#if MUTANT"):
            inside_mutant = True
        elif line.startswith(("#else", "#endif")):
            inside_mutant = False
        elif inside_mutant:
            mutant_only.add(number)
    assert len(moves) > 20
    assert sorted(set(moves) - mutant_only - reached) == []


# Each broken protocol, and the assertion its counterexample breaks.
MUTANTS = {
    1: ("complete without the lease-id check", "valid[g]", "record P -> S by COMPLETE"),
    2: ("begin takes over a live lease", "( !(valid[1])&& !(valid[2]))", "record P -> P by BEGIN"),
    3: ("renew brings an expired lease back", "valid[g]", "record P -> P by RENEW"),
    4: ("consume takes over a live lease", "assertion violated 0", "a client ended guard 1's live lease"),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_broken_protocol_is_refuted(tmp_path: Path, mutant: int) -> None:
    what, violated, last_move = MUTANTS[mutant]
    define = f"-DMUTANT={mutant}"
    # breadth first: the shortest counterexample
    search = _search(tmp_path / "mutant", [define], ["-DNOCLAIM", "-DBFS"], [])
    assert _errors(search) == 1, f"{what}: not refuted\n{search.output}"
    assert violated in search.output, search.output
    trail = subprocess.run(
        [tool("spin"), "-T", "-t", define, MODEL.name],
        cwd=search.work,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    # the trail's printed steps, up to where it ends (then spin dumps the variables)
    steps = trail.split("spin: trail ends", 1)[0].splitlines()
    steps = [line.strip() for line in steps if line.strip() and not line.startswith("ltl ")]
    assert last_move in steps, trail
    print(f"\nmutant {mutant} ({what}), counterexample:\n" + "\n".join(steps))
