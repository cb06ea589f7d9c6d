"""A stand-in for ``python:3.12-slim``, built once per machine into podman's storage.

No container registry is reachable from these machines, so the image test
cannot pull the Dockerfile's real base. This builds an image that plays its
part, from what the machine can reach:

- a Debian bookworm root (``debootstrap --variant=minbase``) from the mirror
  that apt on this machine uses (read from /etc/apt/sources.list* at run
  time, never written down here), with ``ca-certificates``, ``netbase``,
  ``tzdata`` and the Debian packages of every shared library the interpreter
  below links (found with ``ldd`` and ``dpkg -S``, so nothing is guessed);
- a CPython 3.12 in ``/usr/local``, as the official image has it: a copy of
  the machine's own pyenv build (``/root/.pyenv/versions/3.12.*``, or the
  prefix in ``TOKEN_SERVICE_STANDIN_PYTHON``), relocated — its scripts' and
  sysconfig's prefix rewritten, ``ldconfig`` run so ``libpython3.12.so``
  is found in ``/usr/local/lib`` — without its test suite, tkinter, idle and
  ``*.pyc`` (what the official image leaves out too), and with pip installed
  by ``ensurepip`` from the wheel CPython bundles (no network);
- the official image's ``LANG=C.UTF-8``, ``PATH`` and ``CMD ["python3"]``.

What differs from the real base: the patch release of CPython (the
machine's, e.g. 3.12.1, not the newest 3.12), the pip release (the bundled
one), and Debian's package set (what the interpreter needs, not exactly the
official list). The Dockerfile does not depend on any of these: it needs a
``python``/``pip`` 3.12 in ``/usr/local/bin`` and ``useradd``/``groupadd``.

The image is kept (``podman image exists`` skips the build next time): it is
per machine, like an apt cache, and takes about 150 MB of vfs storage. Remove
it with ``podman --storage-driver vfs rmi localhost/token-service-standin-python:3.12-slim``.

    python -m tests.image.standin          # build it unless present; print its name
"""

from __future__ import annotations

import fcntl
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

STANDIN_IMAGE = "localhost/token-service-standin-python:3.12-slim"
SUITE = "bookworm"
# Every podman call of the image test uses these: vfs because overlay needs kernel support
# this machine's sandbox does not give, and all users of one storage must agree on the driver.
PODMAN = ("podman", "--storage-driver", "vfs")
# What the official python:3.12-slim installs besides the interpreter's libraries.
BASE_PACKAGES = ("ca-certificates", "netbase", "tzdata")
# Modules the official slim image does not ship (and the libraries they alone would pull in).
LEFT_OUT_MODULES = ("_tkinter",)
LEFT_OUT_DIRS = ("test", "tests", "idle_test", "idlelib", "tkinter", "turtledemo")
LOCK_FILE = Path("/var/lock/token-service-standin.lock")


def run(args: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """A command that must succeed; its output goes into the error if it does not."""
    done = subprocess.run(list(args), capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done  # type: ignore[no-any-return]


def apt_sources(paths: Iterable[Path] | None = None) -> list[tuple[str, str, list[str]]]:
    """(URI, suite, components) of every ``deb`` entry apt reads, one-line and deb822 formats."""
    if paths is None:
        paths = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    entries: list[tuple[str, str, list[str]]] = []
    for path in paths:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line:
                        continue
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
                if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes") == "no":
                    continue
                for uri in fields.get("uris", "").split():
                    for suite in fields.get("suites", "").split():
                        entries.append((uri, suite, fields.get("components", "").split()))
        elif path.suffix == ".list":
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
                if len(words) >= 3 and words[0] == "deb":
                    entries.append((words[1], words[2], words[3:]))
    return entries


def debian_mirror(entries: Sequence[tuple[str, str, list[str]]] | None = None) -> str:
    """The mirror apt installs bookworm's main component from (not the security archive)."""
    for uri, suite, components in apt_sources() if entries is None else entries:
        if suite == SUITE and "main" in components:
            return uri
    raise RuntimeError(f"apt has no source for {SUITE} main: debootstrap needs a mirror")


def python_prefix() -> Path:
    """A CPython 3.12 with a shared libpython: TOKEN_SERVICE_STANDIN_PYTHON, else pyenv's newest 3.12."""
    chosen = os.environ.get("TOKEN_SERVICE_STANDIN_PYTHON")
    if chosen:
        candidates = [chosen]
    else:
        root = os.environ.get("PYENV_ROOT", "/root/.pyenv")
        candidates = sorted(
            glob.glob(f"{root}/versions/3.12.*"),
            key=lambda p: [int(part) for part in re.findall(r"\d+", Path(p).name)],
            reverse=True,
        )
    for candidate in candidates:
        prefix = Path(candidate)
        if (prefix / "bin/python3.12").is_file() and (prefix / "lib/libpython3.12.so.1.0").is_file():
            return prefix
    raise RuntimeError(
        "no CPython 3.12 with a shared libpython found (pyenv's /root/.pyenv/versions/3.12.*, or set "
        "TOKEN_SERVICE_STANDIN_PYTHON to such a prefix): the stand-in base for python:3.12-slim needs one"
    )


def linked_libraries(prefix: Path) -> set[str]:
    """The shared libraries outside the prefix that the interpreter and its extension modules link."""
    binaries = [prefix / "bin/python3.12", prefix / "lib/libpython3.12.so.1.0"]
    dynload = prefix / "lib/python3.12/lib-dynload"
    binaries += [so for so in dynload.glob("*.so") if not so.name.startswith(LEFT_OUT_MODULES)]
    found: set[str] = set()
    for binary in binaries:
        for line in run(["ldd", str(binary)]).stdout.splitlines():
            if "=> not found" in line:
                raise RuntimeError(f"{binary} links a library this machine lacks: {line.strip()}")
            match = re.search(r"=>\s+(/\S+)", line)
            if match and not match.group(1).startswith(str(prefix)):
                found.add(os.path.realpath(match.group(1)))
    return found


def debian_packages(libraries: Iterable[str]) -> set[str]:
    """The Debian packages that hold these files (dpkg -S, by the path as installed)."""
    packages: set[str] = set()
    for library in libraries:
        candidates = [library]
        # dpkg knows /lib/x86_64-linux-gnu/x as /usr/lib/... or the reverse (usrmerge)
        if library.startswith("/usr/lib/"):
            candidates.append(library.removeprefix("/usr"))
        elif library.startswith("/lib/"):
            candidates.append("/usr" + library)
        for path in candidates:
            done = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True, check=False)
            if done.returncode == 0:
                packages.add(done.stdout.split(":", 1)[0].strip())
                break
        else:
            raise RuntimeError(f"no Debian package holds {library}")
    return packages


def install_python(prefix: Path, root: Path) -> None:
    """Copy the interpreter into root/usr/local, as the official image lays it out."""
    target = root / "usr/local"

    def ignore(folder: str, names: list[str]) -> set[str]:
        left_out = {name for name in names if name in LEFT_OUT_DIRS or name == "__pycache__"}
        left_out |= {name for name in names if name.endswith((".pyc", ".a"))}
        left_out |= {name for name in names if name.startswith(LEFT_OUT_MODULES)}
        if Path(folder) == prefix / "lib/python3.12/site-packages":
            left_out |= set(names) - {"README.txt"}  # pip comes from ensurepip below; nothing else
        if Path(folder) == prefix / "bin":
            left_out |= {name for name in names if name.startswith(("pip", "idle", "2to3"))}
        return left_out

    shutil.copytree(prefix, target, symlinks=True, ignore=ignore, dirs_exist_ok=True)
    old, new = str(prefix).encode(), b"/usr/local"
    texts = [
        *(p for p in (target / "bin").iterdir() if p.is_file() and not p.is_symlink()),
        *(target / "lib/python3.12").glob("_sysconfigdata_*.py"),
        *(target / "lib/python3.12").glob("config-3.12-*/Makefile"),
        *(target / "lib/python3.12").glob("config-3.12-*/python-config.py"),
        *(target / "lib/pkgconfig").glob("*.pc"),
    ]
    for path in texts:
        data = path.read_bytes()
        if old in data and b"\0" not in data:  # scripts and text; the ELF binaries keep their RUNPATH
            path.write_bytes(data.replace(old, new))


def chroot(root: Path, *args: str) -> str:
    env = {"PATH": "/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}
    return run(["chroot", str(root), *args], env=env).stdout


@contextmanager
def machine_lock() -> Iterator[None]:
    """One build at a time on this machine (two test runs, or two developers, may ask at once)."""
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with LOCK_FILE.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def machine_store() -> str:
    """Where podman keeps the machine's images (the stand-in among them)."""
    return run([*PODMAN, "info", "--format", "{{.Store.GraphRoot}}"]).stdout.strip()


def image_exists(name: str = STANDIN_IMAGE) -> bool:
    return subprocess.run([*PODMAN, "image", "exists", name], check=False).returncode == 0


def missing_tools() -> list[str]:
    return [tool for tool in ("podman", "debootstrap", "chroot", "ldd", "dpkg") if shutil.which(tool) is None]


def build(name: str = STANDIN_IMAGE, log: object = None) -> float:
    """Build the stand-in unless podman has it; the seconds it took (0 when it was there)."""

    def say(message: str) -> None:
        print(f"standin: {message}", file=log or sys.stderr, flush=True)  # type: ignore[call-overload]

    with machine_lock():
        if image_exists(name):
            say(f"{name} is present (built once per machine): not rebuilt")
            return 0.0
        started = time.monotonic()
        prefix = python_prefix()
        libraries = linked_libraries(prefix)
        packages = sorted(debian_packages(libraries) | set(BASE_PACKAGES))
        mirror = debian_mirror()
        say(f"building {name}: debootstrap {SUITE} (minbase) + CPython from {prefix}")
        work = Path(tempfile.mkdtemp(prefix="token-service-standin-", dir="/var/tmp"))
        root = work / "root"
        try:
            run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(packages)}",
                    SUITE,
                    str(root),
                    mirror,
                ],
                timeout=1800,
            )
            install_python(prefix, root)
            chroot(root, "ldconfig")
            dynload = glob_in(root, "usr/local/lib/python3.12/lib-dynload/*.so")
            binaries = ["/usr/local/bin/python3.12", *dynload]
            missing = [
                line.strip()
                for binary in binaries
                for line in chroot(root, "ldd", binary).splitlines()
                if "not found" in line
            ]
            if missing:
                raise RuntimeError(f"the stand-in's interpreter misses libraries: {missing}")
            chroot(root, "python3.12", "-m", "ensurepip", "--default-pip")
            modules = "ssl, sqlite3, bz2, lzma, zlib, ctypes, readline, curses, hashlib, uuid, decimal, venv"
            chroot(root, "python3", "-c", f"import {modules}")
            # what an apt run or a shell session would leave behind is not part of a base image
            for leftover in ("var/cache/apt/archives", "var/lib/apt/lists", "root/.cache"):
                for path in (root / leftover).glob("*"):
                    if path.is_file():
                        path.unlink()
                    elif path.is_dir() and path.name != "partial":
                        shutil.rmtree(path)
            tar = subprocess.Popen(
                ["tar", "-C", str(root), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE
            )
            imported = subprocess.run(
                [
                    *PODMAN,
                    "import",
                    "--change",
                    "ENV LANG=C.UTF-8",
                    "--change",
                    "ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "--change",
                    'CMD ["python3"]',
                    "--change",
                    "LABEL org.opencontainers.image.description="
                    '"stand-in for python:3.12-slim built by tests/image/standin.py"',
                    "--message",
                    "token-service test stand-in for python:3.12-slim",
                    "-",
                    name,
                ],
                stdin=tar.stdout,
                capture_output=True,
                text=True,
                check=False,
            )
            assert tar.stdout is not None
            tar.stdout.close()
            if tar.wait() != 0 or imported.returncode != 0:
                raise RuntimeError(f"podman import failed: {imported.stderr[-2000:]}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        seconds = time.monotonic() - started
        say(f"built {name} in {seconds:.0f} s")
        return seconds


def glob_in(root: Path, pattern: str) -> list[str]:
    """Paths matching pattern under root, as seen from inside root."""
    return ["/" + str(path.relative_to(root)) for path in root.glob(pattern)]


if __name__ == "__main__":
    build()
    print(STANDIN_IMAGE)
