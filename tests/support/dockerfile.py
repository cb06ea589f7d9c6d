"""The Dockerfile read as data: its instructions, the runtime stage's ENV and USER, and the
graceful timeout of the gunicorn config its CMD runs.

For the tests that hold other files to the image (deploy/kubernetes/, docker-compose.yml):
a number the image sets (its PORT, its user, its drain) is read from here, not written twice.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"


def instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, rest = line.partition(" ")
        result.append((keyword.upper(), rest.strip()))
    return result


def final_stage(steps: list[tuple[str, str]]) -> list[tuple[str, str]]:
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from:]


def image_env(stage: list[tuple[str, str]]) -> dict[str, str]:
    """The stage's ENV, with $NAME expanded as the builder does (from earlier ENV, else this process)."""
    env: dict[str, str] = {}
    for keyword, arguments in stage:
        if keyword == "ENV":
            for pair in shlex.split(arguments):
                name, _, value = pair.partition("=")
                env[name] = re.sub(
                    r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), os.environ.get(m.group(1), "")), value
                )
    return env


@dataclass(frozen=True)
class Image:
    """What the runtime stage sets that a deployment must agree with."""

    env: dict[str, str]
    uid: int
    gid: int | None

    @property
    def port(self) -> int:
        return int(self.env["PORT"])


def runtime_image(path: Path = DOCKERFILE) -> Image:
    stage = final_stage(instructions(path))
    users = [arguments for keyword, arguments in stage if keyword == "USER"]
    assert len(users) == 1, "one USER in the runtime stage"
    uid, _, gid = users[0].partition(":")
    assert uid.isdigit(), f"USER is numeric (runAsNonRoot can only check a number): {users[0]}"
    return Image(image_env(stage), int(uid), int(gid) if gid.isdigit() else None)


def graceful_timeout_seconds() -> int:
    """gunicorn's graceful_timeout as token_service/server/gunicorn_conf.py (the image's CMD's
    config) sets it; read, not imported: importing the config creates the metrics directory and
    sets variables in this process's environment."""
    source = (REPO_ROOT / "token_service" / "server" / "gunicorn_conf.py").read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "graceful_timeout" for target in node.targets
        ):
            assert isinstance(node.value, ast.Constant)
            assert isinstance(node.value.value, int)
            return node.value.value
    raise AssertionError("gunicorn_conf.py sets no graceful_timeout")
