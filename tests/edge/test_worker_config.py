"""A worker's settings read through FrozenConfig (token_service/server/worker_config.py) as gunicorn's."""

from __future__ import annotations

from typing import Any

import pytest
from gunicorn.config import Config
from gunicorn.http import message

from token_service.server.worker_config import FrozenConfig, install

PROPERTIES = ("is_ssl", "sendfile", "reuse_port", "address", "worker_class_str", "proc_name", "env")


def test_every_setting_and_property_reads_as_the_config_does() -> None:
    config = Config()
    config.set("limit_request_line", 1234)
    config.set("keepalive", 7)
    frozen = FrozenConfig(config)
    for name in [*config.settings, *PROPERTIES]:
        assert getattr(frozen, name) == getattr(config, name), name
        assert getattr(frozen, name) == getattr(config, name), name  # the kept value too
    assert frozen.settings is config.settings
    assert frozen.forwarded_allow_networks() == config.forwarded_allow_networks()
    assert str(frozen) == str(config)


def test_a_value_is_kept_after_its_first_read() -> None:
    frozen = FrozenConfig(Config())
    assert frozen.keepalive == 2
    assert frozen.__dict__["keepalive"] == 2  # a plain attribute now: no Config.__getattr__


def test_set_and_setattr_go_to_the_config_and_are_read_anew() -> None:
    config = Config()
    frozen = FrozenConfig(config)
    assert frozen.keepalive == 2
    frozen.set("keepalive", 9)
    assert config.keepalive == 9
    assert frozen.keepalive == 9
    frozen.usage = "x"
    assert config.usage == "x"
    assert frozen.usage == "x"
    with pytest.raises(AttributeError):
        frozen.keepalive = 3  # as on the Config: settings change through set() only
    with pytest.raises(AttributeError):
        _ = frozen.no_such_setting


def test_install_wraps_once() -> None:
    class Worker:
        cfg: Any = Config()

    worker = Worker()
    install(worker)
    install(worker)
    assert isinstance(worker.cfg, FrozenConfig)
    assert not isinstance(worker.cfg.__dict__["_config"], FrozenConfig)


ADDRESSES = ["127.0.0.1", "10.1.2.3", "::1", "fe80::1", "not an address", "127.0.0.1"]
ALLOW_LISTS = [["127.0.0.1", "::1"], ["10.0.0.0/8"], ["*"], []]


def counted_message_module() -> tuple[Any, list[tuple[str, Any]]]:
    """A stand-in for gunicorn.http.message whose _ip_in_allow_list is gunicorn's, counted."""
    import types

    calls: list[tuple[str, Any]] = []

    def decide(address: str, allow_list: Any, networks: Any) -> bool:
        calls.append((address, allow_list))
        return bool(message._ip_in_allow_list(address, allow_list, networks))

    return types.SimpleNamespace(_ip_in_allow_list=decide), calls


def networks_of(allow_list: list[str]) -> list[Any]:
    import ipaddress

    return [ipaddress.ip_network(entry) for entry in allow_list if entry != "*"]


@pytest.mark.skipif(
    not hasattr(message, "_ip_in_allow_list"),
    reason="a gunicorn without _ip_in_allow_list (before 24): nothing to remember",
)
def test_a_peers_trust_is_gunicorns_answer_worked_out_once() -> None:
    from token_service.server.worker_config import remember_peer_trust

    stand_in, calls = counted_message_module()
    remember_peer_trust(stand_in)
    remember_peer_trust(stand_in)  # once: not wrapped twice
    settings = [(allow_list, networks_of(allow_list)) for allow_list in ALLOW_LISTS]
    for _ in range(3):
        for allow_list, networks in settings:
            for address in ADDRESSES:
                expected = message._ip_in_allow_list(address, allow_list, networks)
                assert stand_in._ip_in_allow_list(address, allow_list, networks) is expected
    # each address asked of each list once, however often it came
    assert len(calls) == len(set(ADDRESSES)) * len(ALLOW_LISTS)
    # another list (another worker's settings, say), even with the same entries: asked anew
    other = ["10.0.0.0/8"]
    assert stand_in._ip_in_allow_list("10.1.2.3", other, networks_of(other)) is True
    assert len(calls) == len(set(ADDRESSES)) * len(ALLOW_LISTS) + 1


def test_peers_beyond_the_remembered_ones_are_decided_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from token_service.server import worker_config

    monkeypatch.setattr(worker_config, "PEERS_REMEMBERED", 2)
    stand_in, calls = counted_message_module()
    worker_config.remember_peer_trust(stand_in)
    allow_list = ["127.0.0.1"]
    networks = networks_of(allow_list)
    for address in ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.3", "127.0.0.1"]:
        stand_in._ip_in_allow_list(address, allow_list, networks)
    assert [address for address, _ in calls] == ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.3"]


def test_a_gunicorn_without_the_function_is_left_alone() -> None:
    import types

    from token_service.server.worker_config import remember_peer_trust

    old = types.SimpleNamespace()
    remember_peer_trust(old)
    assert not hasattr(old, "_ip_in_allow_list")
