"""The Dockerfile built and run as an operator would, with podman, against a real redis-server.

There is no Docker engine on these machines and no registry is reachable, so:

- **podman** builds and runs the image (Debian's podman, buildah and runc):
  ``podman --storage-driver vfs build --format docker --isolation chroot
  --network host --pull=never`` (``--format docker`` keeps ``HEALTHCHECK``,
  which the OCI format drops), ``podman --storage-driver vfs --runtime runc
  run --network host`` with explicit ``nofile``/``nproc`` limits (crun fails
  on this kernel's cgroups, and podman's default rlimits are refused). There
  is no systemd to run health checks on their timer, so the test runs the
  image's ``HEALTHCHECK`` with ``podman healthcheck run``.
- **The base image is a stand-in** for ``python:3.12-slim``
  (tests/image/standin.py: Debian bookworm minbase and the machine's own
  CPython 3.12 in /usr/local), built once per machine and kept in podman's
  storage; the Dockerfile takes it through its ``BASE_IMAGE`` build
  argument. Everything else — the Dockerfile, the locks, the wheel, the
  gunicorn config, the user, the health check — is what ships.
- **pip inside the build reaches the package index as pip on this machine
  does**: the machine's effective pip configuration (its files and ``PIP_*``
  variables, merged into one file) and its CA bundle are mounted into the
  build's ``RUN`` steps only (``--volume``), with any local folders that
  configuration names; none of it is written into the project or the image.

Each check prints its result. The test removes the containers and the image
it made (the cached stand-in base stays: it is per machine). It needs root
and podman: without them it skips, saying why; under CI it fails instead.
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
import pytest

from tests.image import standin
from tests.support.dockerfile import graceful_timeout_seconds, runtime_image
from tests.support.docs import code_blocks, run_sh, section
from tests.support.processes import REPO_ROOT, RedisServer, children, free_port, wait_until

pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.timeout(3600)]

# This run's own podman storage (a folder removed at the end), which sees the machine's
# storage, where the cached stand-in base lives, as a read-only image store: what the test
# builds and runs stays in its folder, apart from any other podman user's work.
RUN_ROOT = Path("/var/tmp") / f"ts-image-test-{uuid.uuid4().hex[:10]}"
PODMAN: list[str] = []  # filled by the image fixture (it asks podman where the machine's storage is)
RUN: list[str] = []
# a key of its own: the image serves on a real Redis, where the development key is refused
SERVICE_KEY = "image-test-key-0123456789"
README_KEY = "dev-service-key-change-me"  # the README walk-through's key
DRAIN_SECONDS = int(runtime_image().env["TOKEN_SERVICE_DRAIN_SECONDS"])
GRACEFUL_SECONDS = graceful_timeout_seconds()  # gunicorn_conf.graceful_timeout
STOP_TIMEOUT_SECONDS = 20  # the documented `docker run --stop-timeout`
RUN_ID = RUN_ROOT.name.rsplit("-", 1)[1]


_capture: list[object] = []  # pytest's capture manager, so that say() reaches the terminal


@pytest.fixture(autouse=True, scope="module")
def _terminal(pytestconfig: pytest.Config) -> None:
    _capture[:] = [pytestconfig.pluginmanager.getplugin("capturemanager")]


def say(line: str) -> None:
    """One check's result, on the terminal even while pytest captures output (as capsys.disabled)."""
    manager = _capture[0] if _capture else None
    if manager is None:
        print(f"image check: {line}", file=sys.stderr, flush=True)
        return
    with manager.global_and_fixture_disabled():  # type: ignore[attr-defined]
        print(f"image check: {line}", file=sys.stderr, flush=True)


def requirements_missing() -> str | None:
    if os.geteuid() != 0:
        return "the image test runs podman as root (rootful vfs storage, runc)"
    missing = [*standin.missing_tools(), *(t for t in ("runc", "buildah") if shutil.which(t) is None)]
    if missing:
        return f"the image test needs {', '.join(missing)} (apt-get install podman buildah runc debootstrap)"
    return None


def podman(*args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {done.returncode}: {done.stderr[-3000:]}")
    return done


# --- pip's configuration for the build -------------------------------------------------------


def machine_pip_config() -> dict[str, dict[str, str]]:
    """pip's effective settings here (its files, then PIP_* variables over them), by section."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    sections: dict[str, dict[str, str]] = {}
    variables: dict[str, str] = {}
    for line in listed.splitlines():
        found = re.fullmatch(r"([^.]*)\.([^=]+)='(.*)'", line.strip())
        if not found:
            continue
        where, key, value = found.groups()
        if where == ":env:":
            variables[key] = value
        else:
            sections.setdefault(where, {})[key] = value
    # the PIP_* variables override every file, for every command
    sections.setdefault("global", {}).update(variables)
    return sections


def paths_named(sections: dict[str, dict[str, str]]) -> set[Path]:
    """The local files and folders a pip configuration points at (find-links, file:// indexes, cert...)."""
    named: set[Path] = set()
    for settings in sections.values():
        for value in settings.values():
            for word in value.split():
                path = Path(word.removeprefix("file://"))
                if path.is_absolute() and path.exists():
                    # a file:///x/simple index: the whole tree, for the files its pages link to
                    named.add(path.parent if word.startswith("file://") and path.name == "simple" else path)
    return named


def build_volumes(scratch: Path) -> list[str]:
    """--volume arguments: the machine's pip configuration and CA bundle, for the build's RUN steps."""
    sections = machine_pip_config()
    config = configparser.ConfigParser(interpolation=None)
    for name, settings in sections.items():
        config[name] = settings
    merged = scratch / "pip.conf"
    with merged.open("w") as out:
        config.write(out)
    # /etc/pip.conf: the global file every pip reads, the base's and the build environments' alike
    volumes = [f"{merged}:/etc/pip.conf:ro"]
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    named = paths_named(sections)
    if bundle.is_file():
        named.add(bundle)
    for path in sorted(named):
        volumes.append(f"{path}:{path}:ro")
    return [argument for volume in volumes for argument in ("--volume", volume)]


# --- the image ------------------------------------------------------------------------------


def project_version() -> str:
    """The version the wheel carries, as the build's VERSION argument (the image's label)."""
    import token_service

    version = getattr(token_service, "__version__", None)
    if isinstance(version, str):
        return version
    import tomllib

    return str(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"])


@dataclass
class Image:
    name: str
    version: str
    build_seconds: float
    standin_seconds: float
    build_log: str
    containers: list[str] = field(default_factory=list)

    def run(self, purpose: str, *args: str, command: Sequence[str] = ()) -> Container:
        name = f"ts-image-test-{RUN_ID}-{purpose}"
        self.containers.append(name)
        done = subprocess.run(
            [*RUN, "--detach", "--name", name, *args, self.name, *command],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, f"podman run failed: {done.stderr[-3000:]}"
        return Container(name)

    def serve(self, purpose: str, redis_url: str, *args: str) -> tuple[Container, str]:
        """The image's own command on a free port of the host's network, once it is ready.

        The port is free when picked, but other processes on this shared machine may take it
        before gunicorn binds it; then the container exits saying so, and another port is tried.
        """
        for attempt in range(5):
            port = free_port()
            container = self.run(
                f"{purpose}-{attempt}",
                *args,
                "--env",
                f"PORT={port}",
                "--env",
                f"TOKEN_SERVICE_REDIS_URL={redis_url}",
                "--env",
                f"TOKEN_SERVICE_API_KEYS={SERVICE_KEY}",
                "--env",
                "WEB_CONCURRENCY=2",
            )
            url = f"http://127.0.0.1:{port}"
            if container.wait_ready(url, retry_if_taken=attempt < 4):
                return container, url
            podman("rm", "--force", "--time", "0", container.name)
        raise AssertionError("unreachable: the last attempt fails in wait_ready")


@dataclass
class Container:
    name: str

    def inspect(self, template: str) -> str:
        return podman("inspect", "--format", template, self.name).stdout.strip()

    def running(self) -> bool:
        return self.inspect("{{.State.Running}}") == "true"

    def healthcheck(self) -> tuple[int, str]:
        done = podman("healthcheck", "run", self.name, check=False, timeout=60)
        return done.returncode, (done.stdout + done.stderr).strip()

    def health_after_checks(self, want: str, within_seconds: float = 180) -> tuple[str, list[str]]:
        """Run the image's HEALTHCHECK until the container's health is ``want`` (or time is up).

        One run can fail on a loaded machine without anything being wrong: the check starts a
        Python in the container and must finish within the image's 3 s ``--timeout``, which a
        machine at load 15 does not always give it. That is why the image asks for 3 failures in
        a row (``--retries=3``, failures in the 10 s ``--start-period`` not counted) before it
        calls a container unhealthy; the test goes by the same rule, so it waits for the state
        instead of counting on one run's speed.
        """
        outputs: list[str] = []
        health = ""
        deadline = time.monotonic() + within_seconds
        while time.monotonic() < deadline:
            _, output = self.healthcheck()
            outputs.append(output)
            health = self.inspect("{{.State.Health.Status}}")
            if health == want:
                break
        return health, outputs

    def logs(self) -> str:
        done = podman("logs", self.name, check=False)
        return done.stdout + done.stderr

    def wait_ready(self, url: str, retry_if_taken: bool = False) -> bool:
        """Until /readyz answers 200; a container that exits meanwhile fails at once, with its log
        (False instead if it exited because its port was taken, and retry_if_taken)."""

        def ready() -> str | bool:
            if not self.running():
                return "exited"
            return httpx.get(url + "/readyz", timeout=2).status_code == 200 and "ready"

        try:
            state = wait_until(ready, 120, what=f"{self.name} to serve")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.logs()[-3000:]}") from None
        if state == "exited":
            logs = self.logs()
            # serve's own check ("port N on 0.0.0.0 is in use"), or the bind losing a race after it
            if retry_if_taken and ("Address already in use" in logs or " is in use " in logs):
                return False
            code = self.inspect("{{.State.ExitCode}}")
            raise AssertionError(f"{self.name} exited {code} before serving:\n{logs[-3000:]}")
        return True


@pytest.fixture(scope="module")
def image() -> Iterator[Image]:
    reason = requirements_missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(reason + " — CI must build and run the image", pytrace=False)
        pytest.skip(reason)
    standin_seconds = standin.build()
    PODMAN[:] = [
        *standin.PODMAN,
        "--root",
        str(RUN_ROOT / "storage"),
        "--runroot",
        str(RUN_ROOT / "run"),
        "--storage-opt",
        f"vfs.imagestore={standin.machine_store()}",
    ]
    RUN[:] = [
        *PODMAN,
        "--runtime",
        "runc",
        "run",
        "--network",
        "host",
        "--ulimit",
        "nofile=16384:16384",
        "--ulimit",
        "nproc=4096:4096",
    ]
    version = project_version()
    name = f"localhost/token-service-image-test:{RUN_ID}"
    with tempfile.TemporaryDirectory(prefix="ts-image-build-") as scratch:
        started = time.monotonic()
        built = subprocess.run(
            [
                *PODMAN,
                "build",
                "--format",
                "docker",
                "--isolation",
                "chroot",
                "--network",
                "host",
                "--pull=never",
                # each stage committed as one layer: with vfs every layer is a full copy of the
                # tree, and a build keeping Docker's layers took 3-4 GB and about 7 minutes here
                "--layers=false",
                "--build-arg",
                f"BASE_IMAGE={standin.STANDIN_IMAGE}",
                "--build-arg",
                f"VERSION={version}",
                *build_volumes(Path(scratch)),
                "--tag",
                name,
                "--file",
                str(REPO_ROOT / "Dockerfile"),
                str(REPO_ROOT),
            ],
            capture_output=True,
            text=True,
            timeout=3000,
            check=False,
        )
        build_seconds = time.monotonic() - started
    log = built.stdout + built.stderr
    built_image = Image(name, version, build_seconds, standin_seconds, log)
    try:
        assert built.returncode == 0, f"podman build failed:\n{log[-6000:]}"
        yield built_image
    finally:
        podman("rm", "--all", "--force", "--time", "0", check=False)
        podman("rmi", "--all", "--force", check=False)  # this run's store; the base's is read-only
        mounted = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounted if m.startswith(str(RUN_ROOT))), reverse=True):
            subprocess.run(["umount", "--lazy", mount], check=False)
        shutil.rmtree(RUN_ROOT, ignore_errors=True)
        say(
            f"cleaned up: {len(built_image.containers)} containers, image {name} and its layers "
            f"({RUN_ROOT} removed; the stand-in base stays cached)"
        )
        assert not RUN_ROOT.exists()
        assert standin.image_exists()


@pytest.fixture(scope="module")
def service(image: Image, redis_server: RedisServer) -> tuple[Container, str]:
    """The image run as docs/deployment.md's `docker run` line says, on a free port."""
    return image.serve("serve", redis_server.url, "--stop-timeout", str(STOP_TIMEOUT_SECONDS))


def test_the_image_builds_on_the_base_argument_with_its_label(image: Image) -> None:
    size_bytes = int(podman("image", "inspect", "--format", "{{.Size}}", image.name).stdout)
    if image.standin_seconds:
        say(f"stand-in base {standin.STANDIN_IMAGE} built in {image.standin_seconds:.0f} s (cold)")
    else:
        say(f"stand-in base {standin.STANDIN_IMAGE} was cached (per machine)")
    say(f"podman build: {image.build_seconds:.0f} s; image size {size_bytes / 1e6:.1f} MB")
    labels = podman("image", "inspect", "--format", "{{json .Labels}}", image.name).stdout
    assert f'"org.opencontainers.image.version":"{image.version}"' in labels, labels
    say(f"label org.opencontainers.image.version = {image.version}: ok")
    healthcheck = podman("image", "inspect", "--format", "{{json .Config.Healthcheck}}", image.name).stdout
    assert "urllib.request" in healthcheck, "--format docker keeps the HEALTHCHECK"
    user = podman("image", "inspect", "--format", "{{.Config.User}}", image.name).stdout.strip()
    assert user == "10001:10001"
    # useradd --system with uid 10001 warned that it is outside the system range
    assert not re.search(r"useradd.*warning|warning.*uid", image.build_log, re.IGNORECASE), image.build_log
    say("HEALTHCHECK kept, USER 10001:10001, useradd without warnings: ok")
    # the build stage's wheels, backend and source stay behind: one layer holds the environment
    contents = subprocess.run(
        [*RUN, "--rm", image.name, "sh", "-c", "ls -d /wheels /src /opt/build /tmp/dist 2>/dev/null; true"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout.split()
    assert contents == [], contents
    say("no /wheels, /src, build backend or wheel in the image: ok")


def test_the_readme_walkthrough_against_the_container(service: tuple[Container, str]) -> None:
    _, url = service
    documented = section("README.md", "walkthrough")
    [walkthrough] = [block for block in code_blocks("README.md", "sh") if block.code in documented]
    # The README's key is the development key, which the image refuses on a real Redis: a user
    # follows the walk-through with a key of their own, as this container has.
    own_key = replace(walkthrough, code=walkthrough.code.replace(README_KEY, SERVICE_KEY))
    assert own_key.code != walkthrough.code, f"README.md's walk-through no longer uses {README_KEY}"
    output = run_sh(own_key, base_url=url).splitlines()
    statuses = [line.rsplit(" ", 1)[-1] for line in output]
    assert statuses == ["200", "409", "200"], output
    say(f"README walk-through in the container: {', '.join(statuses)}: ok")


def test_every_gunicorn_process_runs_as_the_image_user(service: tuple[Container, str]) -> None:
    container, _ = service
    master = int(container.inspect("{{.State.Pid}}"))
    processes = [master, *sorted(children(master))]
    assert len(processes) == 3, f"a master and WEB_CONCURRENCY=2 workers, found {processes}"
    for pid in processes:
        status = Path(f"/proc/{pid}/status").read_text()
        uids = re.search(r"^Uid:\s+(.*)$", status, re.MULTILINE)
        gids = re.search(r"^Gid:\s+(.*)$", status, re.MULTILINE)
        assert uids
        assert gids
        assert set(uids.group(1).split()) == {"10001"}, (pid, uids.group(0))  # real, effective, saved, fs
        assert set(gids.group(1).split()) == {"10001"}, (pid, gids.group(0))
        # `token-service serve` runs gunicorn in its own process: the master, and the forked workers
        assert "token-service\0serve" in Path(f"/proc/{pid}/cmdline").read_text()
    assert "Booting worker" in container.logs()  # gunicorn's, not granian's
    say(f"{len(processes)} gunicorn processes (master + 2 workers), all uid/gid 10001: ok")


def test_the_healthcheck_passes_while_it_serves(service: tuple[Container, str]) -> None:
    container, _ = service
    health, outputs = container.health_after_checks("healthy")
    assert health == "healthy", outputs
    say(f"HEALTHCHECK on the serving container: status {health} after {len(outputs)} run(s): ok")


def test_the_healthcheck_fails_with_nothing_listening(image: Image) -> None:
    # The image's own HEALTHCHECK, in a container whose command does not listen. On the host's
    # network its default port, 8000, is where a developer's `make run` answers (the test then
    # saw "healthy"): the container gets a port of its own, held bound here but not listening,
    # so nothing can answer on it while the checks run.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        container = image.run(
            "silent", "--env", f"PORT={port}", command=["python", "-c", "import time; time.sleep(600)"]
        )
        wait_until(container.running, 60, what="the silent container")
        health, outputs = container.health_after_checks("unhealthy")
    assert health == "unhealthy", outputs
    assert len(outputs) >= 3, outputs  # --retries=3: three failed runs in a row, not one
    say(f"HEALTHCHECK with nothing listening on {port}: {health} after {len(outputs)} runs: ok")
    podman("rm", "--force", "--time", "0", container.name)


def test_a_read_only_root_with_a_tmpfs_tmp_serves(image: Image, redis_server: RedisServer) -> None:
    # --read-only-tmpfs=false: podman would otherwise add tmpfs on /run and /var/tmp too, which
    # Docker's --read-only does not; the image must make do with the one tmpfs an operator gives
    container, url = image.serve(
        "readonly", redis_server.url, "--read-only", "--read-only-tmpfs=false", "--tmpfs", "/tmp"
    )
    assert container.inspect("{{.HostConfig.ReadonlyRootfs}}") == "true"
    auth = {"Authorization": f"Bearer {SERVICE_KEY}"}
    generated = httpx.post(url + "/token/generate", json={"scope": "payment.create"}, timeout=30)
    assert generated.status_code == 201, generated.text
    token = generated.json()["token"]
    body = {"token": token, "scope": "payment.create", "request_id": "r-1"}
    consumed = httpx.post(url + "/token/consume", json=body, headers=auth, timeout=30)
    assert consumed.status_code == 200, consumed.text
    assert httpx.get(url + "/metrics", timeout=30).status_code == 200  # multiprocess files under /dev/shm
    health, outputs = container.health_after_checks("healthy")
    assert health == "healthy", outputs
    written = subprocess.run(
        [*PODMAN, "exec", container.name, "sh", "-c", "touch /opt/venv/x 2>&1; touch /tmp/x && echo tmp-ok"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout
    assert "Read-only file system" in written
    assert "tmp-ok" in written
    say("--read-only with a tmpfs /tmp: generate 201, consume 200, /metrics 200, healthy: ok")
    podman("rm", "--force", "--time", "0", container.name)


def test_sigterm_drains_then_exits_within_drain_and_graceful_timeout(
    image: Image, redis_server: RedisServer
) -> None:
    container, url = image.serve("drain", redis_server.url)
    # `docker stop` as the documented `--stop-timeout 20` makes it: SIGTERM, then SIGKILL after 20 s
    stopped: dict[str, float] = {}

    def stop() -> None:
        started = time.monotonic()
        podman("stop", "--time", str(STOP_TIMEOUT_SECONDS), container.name, timeout=120)
        stopped["seconds"] = time.monotonic() - started

    stopper = threading.Thread(target=stop)
    stopper.start()
    try:
        # while draining: /readyz fails so the balancer moves away, the instance still serves
        wait_until(
            lambda: httpx.get(url + "/readyz", timeout=2).status_code == 503,
            DRAIN_SECONDS + 30,
            what="/readyz to answer 503",
        )
        during = httpx.post(url + "/token/generate", json={"scope": "payment.create"}, timeout=5)
        healthz = httpx.get(url + "/healthz", timeout=5)
    finally:
        stopper.join(timeout=120)
    draining_seen = container.running() or "seconds" in stopped
    assert draining_seen
    assert "seconds" in stopped, "podman stop did not return"
    exit_code = container.inspect("{{.State.ExitCode}}")
    logs = container.logs()
    assert exit_code == "0", f"exit {exit_code} (137: killed at the stop timeout)\n{logs[-3000:]}"
    assert "draining for 5 s" in logs
    say(
        f"SIGTERM: /readyz 503 while draining (generate {during.status_code}, "
        f"/healthz {healthz.status_code}), "
        f"exit 0 after {stopped['seconds']:.1f} s (drain {DRAIN_SECONDS} s + graceful {GRACEFUL_SECONDS} s, "
        f"stop timeout {STOP_TIMEOUT_SECONDS} s): ok"
    )
    assert during.status_code == 201
    assert healthz.status_code == 200


def test_one_setting_serves_it_under_granian_behind_a_proxy(image: Image, redis_server: RedisServer) -> None:
    """TOKEN_SERVICE_SERVER=granian in an image run behind a proxy (TOKEN_SERVICE_TRUSTED_PROXY_HOPS=1,
    as the Kubernetes recipe and the nginx recipe's service set it); without a proxy, a refusal."""
    refused = image.run(
        "granian-exposed",
        "--env",
        f"PORT={free_port()}",
        "--env",
        f"TOKEN_SERVICE_REDIS_URL={redis_server.url}",
        "--env",
        f"TOKEN_SERVICE_API_KEYS={SERVICE_KEY}",
        "--env",
        "TOKEN_SERVICE_SERVER=granian",
    )
    wait_until(lambda: not refused.running(), 120, what="the exposed granian container to stop")
    assert refused.inspect("{{.State.ExitCode}}") == "2"
    assert "TOKEN_SERVICE_TRUSTED_PROXY_HOPS=1" in refused.logs()
    podman("rm", "--force", "--time", "0", refused.name)

    container, url = image.serve(
        "granian",
        redis_server.url,
        "--stop-timeout",
        str(STOP_TIMEOUT_SECONDS),
        "--env",
        "TOKEN_SERVICE_SERVER=granian",
        "--env",
        "TOKEN_SERVICE_TRUSTED_PROXY_HOPS=1",
    )
    generated = httpx.post(url + "/token/generate", json={"scope": "payment.create"}, timeout=30)
    assert generated.status_code == 201, generated.text
    assert generated.headers["server"] == "granian"
    consumed = httpx.post(
        url + "/token/consume",
        json={"token": generated.json()["token"], "scope": "payment.create"},
        headers={"Authorization": f"Bearer {SERVICE_KEY}"},
        timeout=30,
    )
    assert consumed.status_code == 200, consumed.text
    # serve (pid 1 of the container) -> granian's main process -> its WEB_CONCURRENCY=2 workers
    serve = int(container.inspect("{{.State.Pid}}"))
    processes = [serve, *children(serve)]
    processes += [worker for main in children(serve) for worker in children(main)]
    assert len(processes) == 4, processes
    for pid in processes:
        uids = re.search(r"^Uid:\s+(.*)$", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
        assert uids
        assert set(uids.group(1).split()) == {"10001"}, (pid, uids.group(0))
    assert "it relies on the proxy in front" in container.logs()  # said at every start
    started = time.monotonic()
    podman("stop", "--time", str(STOP_TIMEOUT_SECONDS), container.name, timeout=120)
    stopped_seconds = time.monotonic() - started
    logs = container.logs()
    assert container.inspect("{{.State.ExitCode}}") == "0", logs[-3000:]
    assert "draining for 5 s" in logs
    say(
        f"TOKEN_SERVICE_SERVER=granian: refused without a proxy (exit 2); behind one, generate 201 "
        f"(server: granian), consume 200, {len(processes)} processes uid 10001, drained and exited 0 "
        f"after {stopped_seconds:.1f} s: ok"
    )
