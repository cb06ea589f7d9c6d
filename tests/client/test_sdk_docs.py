"""The SDK pages' examples (docs/sdk.md, docs/integrations/flask.md and
docs/integrations/wsgi-middleware.md), run as written against real Redis and gunicorn."""

from __future__ import annotations

import pytest
import redis

from tests.support.docs import code_blocks, run_python
from tests.support.processes import Gunicorn, RedisServer
from tests.support.service import API_KEY
from token_service.client import TokenClient

pytestmark = pytest.mark.real

PAGES = ["docs/sdk.md", "docs/integrations/flask.md", "docs/integrations/wsgi-middleware.md"]


def test_the_pages_have_only_python_examples() -> None:
    assert len(code_blocks("docs/sdk.md", "python")) >= 3
    for page in PAGES:
        assert {block.lang for block in code_blocks(page)} == {"python"}, page


@pytest.mark.parametrize("page", PAGES)
def test_the_examples_run(
    page: str,
    redis_server: RedisServer,
    real_redis: redis.Redis,
    gunicorn: Gunicorn,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOKEN_SERVICE_URL", gunicorn.url)
    monkeypatch.setenv("TOKEN_SERVICE_API_KEY", API_KEY)
    monkeypatch.setenv("TOKEN_SERVICE_REDIS_URL", redis_server.url)
    namespace: dict[str, object] = {"__name__": "docs_examples"}
    try:
        printed = "".join(run_python(block, namespace) for block in code_blocks(page))
    finally:
        # the examples' clients live as long as a program would: close them before the next test
        for value in namespace.values():
            if isinstance(value, redis.Redis | TokenClient):
                value.close()
    if page == "docs/sdk.md":
        assert "duplicate refused" in printed
    assert real_redis.keys("ts:*")  # they really ran against this Redis
