"""Every code block of README.md and docs/ is run by a test: the ones of the pages listed
in ``RUN_HERE`` by this file, the others by the test that ``RUN_ELSEWHERE`` names.

A page that is in neither list fails ``test_every_page_is_listed``, so a new page
cannot go untested unnoticed. The README's walk-through and SDK snippet run as
written against ``make run`` (the embedded store, the Makefile's development key).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.support.docs import Block, code_blocks, make_here, pages, run_python, run_sh, section, shell_env
from tests.support.processes import REPO_ROOT, RedisServer, free_port, wait_until

# Pages whose blocks this file runs (each has its test below).
RUN_HERE = {
    "README.md",
    "docs/index.md",
    "docs/quickstart.md",
    "docs/topologies.md",
    "docs/security.md",
    "docs/architecture.md",
    "docs/testing.md",
}
# Pages whose blocks another test runs (the page's owner keeps that test up to date).
RUN_ELSEWHERE = {
    "docs/sdk.md": "tests/client/test_sdk_docs.py",
    "docs/integrations/flask.md": "tests/client/test_sdk_docs.py",
    "docs/integrations/wsgi-middleware.md": "tests/client/test_sdk_docs.py",
    "docs/integrations/asgi.md": "tests/client/test_asgi_docs.py",
    "docs/frontend.md": "tests/frontend/test_docs_snippets.py",
    "docs/configuration.md": "tests/docs/test_pages_without_code.py",
    "docs/operations.md": "tests/ops/test_operations_docs.py",
    "docs/performance.md": "tests/docs/test_pages_without_code.py",
    "docs/deployment.md": "tests/docs/test_deployment_docs.py",
    "docs/kubernetes.md": "tests/deploy/test_kubernetes.py",
    "docs/install.md": "tests/test_shipped.py",
    "docs/http-api.md": "tests/contract/test_generated_clients.py",
    "docs/durable.md": "tests/durable/test_docs_examples.py",
    "docs/integrations/functions.md": "tests/integrations/test_docs.py",
    "docs/integrations/celery.md": "tests/integrations/test_docs.py",
    "docs/integrations/fastapi.md": "tests/integrations/test_docs.py",
    "docs/integrations/django.md": "tests/integrations/test_docs.py",
    "docs/testing-your-code.md": "tests/testing/test_kit_docs.py",
}
# Blocks of a RUN_HERE page that another test runs: (page, language) → that test.
BLOCKS_ELSEWHERE = {("README.md", "html"): "tests/frontend/test_docs_snippets.py"}
PICTURES = {"text"}  # diagrams, not code


def test_every_page_is_listed() -> None:
    assert not RUN_HERE & RUN_ELSEWHERE.keys()
    assert set(pages()) == RUN_HERE | RUN_ELSEWHERE.keys()


@pytest.mark.parametrize("page", sorted(RUN_ELSEWHERE))
def test_the_test_named_for_a_page_runs_it(page: str) -> None:
    test = REPO_ROOT / RUN_ELSEWHERE[page]
    assert test.is_file(), f"{page}: {test} does not exist"
    assert page in test.read_text(encoding="utf-8"), f"{test} does not read {page}"


def test_blocks_run_elsewhere_name_a_test_that_reads_them() -> None:
    for (page, _lang), test in BLOCKS_ELSEWHERE.items():
        assert page in (REPO_ROOT / test).read_text(encoding="utf-8")


def test_no_page_shows_a_file_by_an_include_line() -> None:
    # `--8<-- "examples/…"` is what a reader sees where Markdown is shown as it is (the
    # repository's web view, an editor): the integration pages write their examples out,
    # and tests/integrations/test_docs.py holds each copy to its file. (README sections,
    # `--8<-- "README.md:name"`, stay included: the README is the repository's front page.)
    for page in pages():
        text = (REPO_ROOT / page).read_text(encoding="utf-8")
        included = re.findall(r'^-{1,}8<-{1,} "([^":]+)"$', text, re.MULTILINE)
        assert included == [], f"{page} includes {included}: write the code out on the page"


@pytest.mark.parametrize("page", ["docs/index.md", "docs/security.md"])
def test_pages_with_no_code(page: str) -> None:
    assert code_blocks(page) == []


def test_the_architecture_page_has_pictures_only() -> None:
    assert {block.lang for block in code_blocks("docs/architecture.md")} <= PICTURES


# --- README.md against `make run` -------------------------------------------------------------


def readme_block(lang: str, number: int = 0) -> Block:
    return code_blocks("README.md", lang)[number]


def test_the_readme_has_the_blocks_this_file_runs() -> None:
    langs = [block.lang for block in code_blocks("README.md")]
    assert langs == ["sh", "sh", "python", "html"], "README blocks changed: update the tests below"
    assert len(readme_block("python").code.strip().splitlines()) <= 5
    assert len((REPO_ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 200


def make_command(target: str) -> str:
    """The README's `make <target>` line, as written (its comment dropped)."""
    [line] = [line for line in readme_block("sh", 0).code.splitlines() if line.startswith(f"make {target}")]
    return line.split("#", 1)[0].strip()


@pytest.fixture(scope="module")
def make_run() -> Iterator[str]:
    """`make run` as the README says, on a free port, in this test run's virtualenv."""
    port = free_port()
    # VENV: the virtualenv running these tests (`.venv` under make test and CI)
    env = shell_env(PORT=str(port), HOST="127.0.0.1", MAKEFLAGS=f"VENV={sys.prefix}")
    log = REPO_ROOT / ".pytest_cache" / f"make-run-{port}.log"
    log.parent.mkdir(exist_ok=True)
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["bash", "-c", make_here(make_command("run"))],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # make, token-service and gunicorn: stopped together
        )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"make run exited: {log.read_text(errors='replace')}")
        return httpx.get(url + "/healthz", timeout=1).status_code == 200

    try:
        wait_until(up, 120, 0.2, what="make run")
        yield url
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.unlink(missing_ok=True)


def make_dry_run(command: str) -> str:
    dry_run = subprocess.run(
        [*command.split(), "--dry-run", f"VENV={sys.prefix}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dry_run.returncode == 0, dry_run.stderr
    return dry_run.stdout


def test_make_test_is_a_target() -> None:
    # `make test` is what CI runs (.ci/run); here only that the README's line is a real target.
    assert "pytest" in make_dry_run(make_command("test"))


def test_the_testing_pages_make_lock_is_a_target() -> None:
    # `make lock` resolves over the network and rewrites the locks: tests/test_lock.py checks
    # the locks it wrote; here, that the page's command is the target that writes them.
    [block] = code_blocks("docs/testing.md")
    assert block.code.strip() == "make lock"
    assert "requirements/lock.py write" in make_dry_run(block.code.strip())


@pytest.mark.slow
def test_the_readme_walkthrough_prints_what_it_says(make_run: str) -> None:
    walkthrough = readme_block("sh", 1)
    assert walkthrough.code in section("README.md", "walkthrough")
    assert len(walkthrough.expected_output()) == 3
    output = run_sh(walkthrough, base_url=make_run).splitlines()
    assert output[0].endswith(" 200")
    assert output[1].endswith(" 409")
    assert '"code":"token_used"' in output[1]
    assert output[2] == '{"outcome":"consumed","replayed":true} 200'


@pytest.mark.slow
def test_the_readme_sdk_snippet_runs_against_make_run(make_run: str) -> None:
    snippet = readme_block("python")
    assert "http://127.0.0.1:8000" in snippet.code  # make run's address, as written
    printed = run_python(snippet, {"__name__": "readme_snippet"}, base_url=make_run)
    assert printed == "Consumed(replayed=False)\n"


# --- docs/quickstart.md: make run on a real Redis ------------------------------------------------


@pytest.mark.real
@pytest.mark.slow
def test_the_quickstart_runs_make_run_on_redis(redis_server: RedisServer) -> None:
    [block] = code_blocks("docs/quickstart.md")
    assert block.lang == "sh"
    assert "redis://127.0.0.1:6379/0" in block.code
    command = make_here(block.code.replace("redis://127.0.0.1:6379/0", redis_server.url))
    port = free_port()
    env = shell_env(PORT=str(port), HOST="127.0.0.1", MAKEFLAGS=f"VENV={sys.prefix}")
    process = subprocess.Popen(
        ["bash", "-c", command],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        ready = lambda: httpx.get(url + "/readyz", timeout=1).status_code == 200  # noqa: E731
        wait_until(ready, 120, 0.2, what="make run")
        token = httpx.post(url + "/token/generate", json={"scope": "s"}, timeout=30).json()["token"]
        consumed = httpx.post(
            url + "/token/consume",
            json={"token": token, "scope": "s"},
            headers={"Authorization": "Bearer a-long-random-service-key"},
            timeout=30,
        )
        assert consumed.json() == {"outcome": "consumed", "replayed": False}
        with redis_server.client() as check:
            assert check.keys("ts:t:*")  # on that Redis, not the embedded store
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def test_the_quickstart_includes_the_readme_sections() -> None:
    text = (REPO_ROOT / "docs/quickstart.md").read_text(encoding="utf-8")
    for name in ("commands", "walkthrough", "sdk", "browser"):
        assert f'--8<-- "README.md:{name}"' in text
        assert section("README.md", name)


# --- docs/topologies.md: the Redis configuration for payments ----------------------------------


@pytest.mark.real
def test_the_redis_configuration_for_payments_is_accepted_by_redis() -> None:
    [block] = code_blocks("docs/topologies.md")
    assert block.lang == "conf"
    directives = [
        line.split("#", 1)[0].split()
        for line in block.code.replace("<size>", "64mb").splitlines()
        if line.split("#", 1)[0].strip()
    ]
    # each directive as redis-server's command line takes it (after the fixture's own defaults)
    server = RedisServer(*[arg for name, *values in directives for arg in (f"--{name}", *values)]).start()
    try:
        client = server.client()
        for name, value in directives:
            expected = str(64 * 1024 * 1024) if value == "64mb" else value
            assert client.config_get(name)[name] == expected, name
    finally:
        server.stop()


def test_no_page_has_an_unlisted_language() -> None:
    known = {"sh", "python", "html", "js", "conf", "sql", "text", ""}  # js: docs/frontend.md, run by Node
    # a page's own: the generator config that tests/contract/ writes and generates with
    known_on = {"docs/http-api.md": {"yaml"}}
    for page in pages():
        for block in code_blocks(page):
            assert block.lang in known | known_on.get(page, set()), (
                f"{block.where}: a {block.lang!r} block: add a runner for it"
            )
            assert not re.search(r"SPEC\.md|\.\./shared", block.code), block.where
