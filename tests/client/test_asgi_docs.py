"""docs/integrations/asgi.md: its example runs as written against a real redis-server."""

from __future__ import annotations

import pytest
import redis

from tests.support.docs import code_blocks, run_python
from tests.support.processes import RedisServer

pytestmark = pytest.mark.real
PAGE = "docs/integrations/asgi.md"


def test_the_asgi_page_runs(
    redis_server: RedisServer, real_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKEN_SERVICE_REDIS_URL", redis_server.url)
    blocks = code_blocks(PAGE)
    assert blocks
    assert {block.lang for block in blocks} == {"python"}
    namespace: dict[str, object] = {"__name__": "docs_examples"}
    printed = "".join(run_python(block, namespace) for block in blocks)
    assert "201 201 true" in printed
    assert real_redis.keys("ts:ik:*")  # it really ran against this Redis
