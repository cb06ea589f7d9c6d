"""A worker's settings read through FrozenConfig (token_service/server/worker_config.py) as gunicorn's."""

from __future__ import annotations

from typing import Any

import pytest
from gunicorn.config import Config

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
