"""TOKEN_SERVICE_REDIS_URL selects the topology; bad URLs stop start-up with a clear message."""

from __future__ import annotations

import pytest

from token_service.config import ConfigError, RedisTarget, Settings, parse_redis_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://h:1/2", RedisTarget("standalone", "redis://h:1/2")),
        ("unix:///run/redis.sock", RedisTarget("standalone", "unix:///run/redis.sock")),
        (
            "redis+sentinel://a:26380,b,[::1]:5/pay-master/3",
            RedisTarget(
                "sentinel",
                "redis+sentinel://a:26380,b,[::1]:5/pay-master/3",
                (("a", 26380), ("b", 26379), ("::1", 5)),
                "pay-master",
                db=3,
            ),
        ),
        (
            "rediss+cluster://svc:p%40ss@n1:7000,n2",
            RedisTarget(
                "cluster",
                "rediss+cluster://svc:p%40ss@n1:7000,n2",
                (("n1", 7000), ("n2", 6379)),
                username="svc",
                password="p@ss",
                ssl=True,
            ),
        ),
    ],
)
def test_urls_parse(url: str, expected: RedisTarget) -> None:
    assert parse_redis_url(url) == expected


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://h", "must start with redis://"),
        ("redis+sentinel://h:1", "/<master-name>"),
        ("redis+cluster://h/1", "only database 0"),
        ("redis+cluster://h:70000", "out of range"),
        ("redis+cluster://", "is not host[:port]"),
        ("redis+sentinel://h/m?sentinel_password=x", "unknown option"),
    ],
)
def test_bad_urls_are_refused_at_start(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match="TOKEN_SERVICE_REDIS_URL") as caught:
        Settings.from_env({"TOKEN_SERVICE_REDIS_URL": url})
    assert message in str(caught.value)


def test_password_is_masked_in_describe() -> None:
    settings = Settings.from_env({"TOKEN_SERVICE_REDIS_URL": "redis+cluster://u:secret@h1:7000,h2:7001"})
    shown = settings.describe()["TOKEN_SERVICE_REDIS_URL"]
    assert "secret" not in shown
    assert shown == "redis+cluster://u:***@h1:7000,h2:7001"
