"""The README's "Using the SDK" examples, run as written against real Redis and gunicorn."""

from __future__ import annotations

import re

import pytest
import redis

from tests.conftest import API_KEY
from tests.support.processes import REPO_ROOT, Gunicorn, RedisServer

pytestmark = pytest.mark.real


def sdk_examples() -> list[str]:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Using the SDK\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


def test_the_sdk_section_has_examples() -> None:
    assert len(sdk_examples()) >= 5


def test_the_readme_sdk_examples_run(
    redis_server: RedisServer,
    real_redis: redis.Redis,
    gunicorn: Gunicorn,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TOKEN_SERVICE_URL", gunicorn.url)
    monkeypatch.setenv("TOKEN_SERVICE_API_KEY", API_KEY)
    monkeypatch.setenv("TOKEN_SERVICE_REDIS_URL", redis_server.url)
    namespace: dict[str, object] = {"__name__": "readme_examples"}
    for number, block in enumerate(sdk_examples(), 1):
        exec(compile(block, f"README.md (SDK example {number})", "exec"), namespace)  # noqa: S102
    assert "duplicate refused" in capsys.readouterr().out
    assert real_redis.keys("ts:t:*")  # they really ran against this Redis
