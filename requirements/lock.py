"""The pinned, hashed dependencies that `make install`, CI and the image install from.

    python requirements/lock.py write   # `make lock`: resolve pyproject.toml again (uv, network)
    python requirements/lock.py check   # `make install`: refuse a lock older than pyproject.toml

``dev.lock`` is the development install (the ``dev`` extra: everything the
tests need), ``server.lock`` the image's (the ``server`` and ``granian`` extras), ``build.lock``
the build backend the image builds the wheel with (pyproject.toml's
``[build-system] requires``, at the versions dev.lock has, so the image's
wheel is built by the backend the tests build it with). uv resolves them
for every platform and Python the project supports, with the hash of every
file. The first line of each lock is a digest of what pyproject.toml asks for
(``build-system.requires``, ``requires-python``, ``dependencies``,
``optional-dependencies``):
``check`` recomputes it, so a dependency added to pyproject.toml without a
new lock stops ``make install`` with a message naming ``make lock``, instead
of an install that quietly resolves something else. Standard library only,
but for ``write``, which runs uv (a dev dependency).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
# lock file → the extras it installs (None: the build backend, [build-system] requires); dev.lock
# comes first: build.lock is resolved within its versions. The image's lock carries granian too, so
# one setting (TOKEN_SERVICE_SERVER=granian) selects it there.
LOCKS: dict[str, tuple[str, ...] | None] = {
    "dev.lock": ("dev",),
    "server.lock": ("server", "granian"),
    "build.lock": None,
}
STAMP = "# pyproject.toml digest: "


def digest(project_dir: Path) -> str:
    pyproject = tomllib.loads((project_dir / "pyproject.toml").read_text(encoding="utf-8"))
    project = pyproject["project"]
    asked = {
        "build-system": pyproject.get("build-system", {}).get("requires", []),
        "requires-python": project.get("requires-python"),
        "dependencies": project.get("dependencies", []),
        "optional-dependencies": project.get("optional-dependencies", {}),
    }
    return hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()[:16]


def stamp_of(lock: Path) -> str | None:
    if not lock.is_file():
        return None
    first = lock.read_text(encoding="utf-8").split("\n", 1)[0]
    return first.removeprefix(STAMP) if first.startswith(STAMP) else None


def check(project_dir: Path, locks_dir: Path) -> int:
    wanted = digest(project_dir)
    stale = [name for name in LOCKS if stamp_of(locks_dir / name) != wanted]
    if stale:
        names = ", ".join(f"requirements/{name}" for name in stale)
        print(
            f"{names}: made for other dependencies than pyproject.toml asks for now. "
            "Run `make lock` (it resolves again, over the network) and commit the result.",
            file=sys.stderr,
        )
        return 1
    return 0


def write(project_dir: Path, locks_dir: Path) -> int:
    wanted = digest(project_dir)
    pyproject = tomllib.loads((project_dir / "pyproject.toml").read_text(encoding="utf-8"))
    for name, extras in LOCKS.items():
        lock = locks_dir / name
        if extras is None:  # the build backend: its requirements on stdin, within dev.lock's versions
            source = ["-", "--constraint", os.path.relpath(locks_dir / "dev.lock", project_dir)]
            stdin = "\n".join(pyproject["build-system"]["requires"]) + "\n"
        else:
            source = [str(project_dir / "pyproject.toml")]
            for extra in extras:
                source += ["--extra", extra]
            stdin = ""
        subprocess.run(
            [
                sys.executable,
                "-m",
                "uv",
                "pip",
                "compile",
                *source,
                "--universal",  # one lock for Linux and macOS, Python 3.11 and later
                "--python-version",
                "3.11",
                "--generate-hashes",
                "--custom-compile-command",
                "make lock",
                "--quiet",
                "--output-file",
                str(lock),
            ],
            check=True,
            cwd=project_dir,
            input=stdin,
            text=True,
        )
        lock.write_text(f"{STAMP}{wanted}\n" + lock.read_text(encoding="utf-8"), encoding="utf-8")
        print(f"wrote requirements/{name}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write or check the dependency locks.")
    parser.add_argument("command", choices=["write", "check"])
    parser.add_argument("--project", type=Path, default=HERE.parent, help="the folder of pyproject.toml")
    parser.add_argument("--locks", type=Path, default=HERE, help="the folder of the lock files")
    args = parser.parse_args(argv)
    command = write if args.command == "write" else check
    return command(args.project.resolve(), args.locks.resolve())


if __name__ == "__main__":
    raise SystemExit(main())
