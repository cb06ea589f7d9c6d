"""Scope labels of the metrics: chosen by the configuration and by authenticated calls, never by a stranger.

Issue 26: 60 unauthenticated ``POST /token/generate`` with scopes ``junk-0…59``
used up the 50 per-scope label slots, and ``payment.create``'s consumes were then
counted as ``_other`` until the instance restarted.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tests.support.service import AUTH
from token_service.config import ConfigError, Settings
from token_service.server.metric_files import OTHER_SCOPE, SharedScopeLabels
from token_service.server.metrics import MAX_SCOPES


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def consumed(scope: str) -> float:
    return sample("token_service_token_outcomes_total", operation="consume", code="consumed", scope=scope)


def test_anonymous_generates_use_up_no_label_slot(make_client: Callable[..., Any]) -> None:
    http = make_client(rate_limit="off", max_outstanding_per_subject=0)
    for n in range(MAX_SCOPES + 10):
        assert http.post("/token/generate", json={"scope": f"junk-{n}"}).status_code == 201
    # a backend's consume (a service key) still gets its scope's own label
    token = http.post("/token/generate", json={"scope": "payment.create"}).json["token"]
    before = consumed("payment.create")
    reply = http.post("/token/consume", json={"token": token, "scope": "payment.create"}, headers=AUTH)
    assert reply.status_code == 200
    assert consumed("payment.create") == before + 1  # was counted as _other
    # and, labelled now, the scope's issuance is counted under its name from then on
    issued = sample("token_service_tokens_issued_total", scope="payment.create")
    assert http.post("/token/generate", json={"scope": "payment.create"}).status_code == 201
    assert sample("token_service_tokens_issued_total", scope="payment.create") == issued + 1
    assert sample("token_service_tokens_issued_total", scope="junk-0") == 0


def test_configured_scopes_have_their_labels_from_the_start(make_client: Callable[..., Any]) -> None:
    http = make_client(rate_limit="off", max_outstanding_per_subject=0, metric_scopes="checkout.pay, refund")
    before = sample("token_service_tokens_issued_total", scope="refund")
    assert http.post("/token/generate", json={"scope": "refund"}).status_code == 201
    assert sample("token_service_tokens_issued_total", scope="refund") == before + 1


@pytest.mark.parametrize(
    "value",
    ["has space", "-leading-dash", "x" * 65, ",".join(f"s{n}" for n in range(MAX_SCOPES + 1)), "ok,é"],
)
def test_bad_metric_scopes_stop_the_start(value: str) -> None:
    with pytest.raises(ConfigError, match="TOKEN_SERVICE_METRIC_SCOPES"):
        Settings.from_env({"TOKEN_SERVICE_METRIC_SCOPES": value})


def test_metric_scopes_are_read_as_a_list() -> None:
    settings = Settings.from_env({"TOKEN_SERVICE_METRIC_SCOPES": " a.b , c:d,a.b ,"})
    assert settings.metric_scopes == ("a.b", "c:d")


def test_every_worker_labels_alike_and_anonymous_lookups_write_nothing(tmp_path: Path) -> None:
    first = SharedScopeLabels(3, tmp_path, ("listed",))
    second = SharedScopeLabels(3, tmp_path, ("listed",))
    # an anonymous caller's scope: no label, nothing written, in either worker
    assert [first.known("junk"), second.known("junk")] == [OTHER_SCOPE, OTHER_SCOPE]
    assert (tmp_path / "scopes.list").read_text().split() == ["listed"]
    assert second.known("listed") == "listed"
    # a backend's consume in one worker: the other worker's generates use the label too
    assert first("pay") == "pay"
    assert second.known("pay") == "pay"
    assert second("refund") == "refund"
    assert first.known("refund") == "refund"
    # full: an authenticated scope is _other too, in every worker
    assert [first("late"), second("late"), second.known("late")] == [OTHER_SCOPE] * 3
    assert (tmp_path / "scopes.list").read_text().split() == ["listed", "pay", "refund"]
