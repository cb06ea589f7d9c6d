"""The alert rules under promtool, the dashboard held to the tested queries, and a real Prometheus
scraping a real gunicorn instance (every metric there at 0 before the first request)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.processes import REPO_ROOT, Gunicorn, RedisServer, free_port, wait_until
from tests.support.service import AUTH, service_env
from token_service.server import metrics

RULES_DIR = REPO_ROOT / "deploy" / "prometheus"
RULES = RULES_DIR / "token-service.rules.yml"
RULES_TEST = RULES_DIR / "token-service.rules.test.yml"
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "token-service.json"


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed (.ci/run installs Debian's prometheus package)")
        pytest.skip(f"{name} is not installed (apt-get install prometheus)")
    return found


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_binary("promtool"), *args], capture_output=True, text=True, timeout=120, cwd=RULES_DIR
    )


def test_the_rules_and_the_config_pass_promtool_check() -> None:
    checked = _promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 16 rules found" in checked.stdout
    config = _promtool("check", "config", "prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr


def test_the_rules_unit_tests_pass() -> None:
    tested = _promtool("test", "rules", RULES_TEST.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def _rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def _tested_queries() -> set[str]:
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    return {case["expr"] for test in tests for case in test.get("promql_expr_test", [])}


def test_every_alert_named_in_the_issue_is_there_and_tested_both_ways() -> None:
    alerts = {rule["alert"] for rule in _rules() if "alert" in rule}
    assert alerts == {
        "TokenServiceStoreErrors",
        "TokenServiceDuplicateSpike",
        "TokenServiceLeaseLost",
        "TokenServiceRateLimited",
        "TokenServiceNotReady",
        "TokenServiceDown",
    }
    firing, silent = set(), set()
    for test in yaml.safe_load(RULES_TEST.read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            (firing if case["exp_alerts"] else silent).add(case["alertname"])
    assert firing == alerts
    assert silent == alerts


def test_the_dashboard_plots_exactly_the_queries_the_rules_test_checks() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    plotted = {target["expr"] for panel in dashboard["panels"] for target in panel["targets"]}
    assert plotted == _tested_queries()
    recorded = {rule["record"] for rule in _rules() if "record" in rule}
    assert plotted - {'up{job="token-service"}'} == recorded


def test_every_metric_has_samples_before_any_request(app: Any) -> None:
    text = app.test_client().get("/metrics").get_data(as_text=True)
    families = {family.name: family for family in text_string_to_metric_families(text)}
    ours = [
        metrics.TOKENS_ISSUED,
        metrics.OUTCOMES,
        metrics.REPLAYS,
        metrics.RATE_LIMITED,
        metrics.REDIS_ERRORS,
        metrics.REQUESTS,
        metrics.LATENCY,
    ]
    for metric in ours:
        assert families[metric._name].samples, metric._name
    routes = {rule.rule for rule in app.url_map.iter_rules()}
    errors = {s.labels["route"] for s in families["token_service_redis_errors"].samples}
    assert routes <= errors
    outcomes = {
        (s.labels["operation"], s.labels["code"]) for s in families["token_service_token_outcomes"].samples
    }
    assert {("consume", "token_used"), ("complete", "lease_lost"), ("begin", "token_in_progress")} <= outcomes
    limits = {s.labels["limit"] for s in families["token_service_rate_limited"].samples}
    assert limits == {"rate", "outstanding"}


# -- a real Prometheus scraping a real gunicorn --------------------------------------------------


class Prometheus:
    def __init__(self, target: str) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="ts-prometheus-"))
        rules = yaml.safe_load(RULES.read_text())
        for group in rules["groups"]:
            group["interval"] = "1s"  # evaluated every second: the test need not wait 30 s
        (self.dir / RULES.name).write_text(yaml.safe_dump(rules))
        config = yaml.safe_load((RULES_DIR / "prometheus.yml").read_text())
        config["global"]["scrape_interval"] = "1s"
        config["scrape_configs"][0]["static_configs"] = [{"targets": [target]}]
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Prometheus:
        self.log = (self.dir / "prometheus.log").open("wb")
        self.process = subprocess.Popen(
            [
                _binary("prometheus"),
                f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=self.dir,
        )

        def ready() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError((self.dir / "prometheus.log").read_text())
            return httpx.get(self.url + "/-/ready", timeout=1).status_code == 200

        wait_until(ready, timeout_seconds=60, what="prometheus")
        return self

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=5).json()
        assert answer["status"] == "success", answer
        return answer["data"]["result"]  # type: ignore[no-any-return]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def scraped_service(redis_server: RedisServer) -> Iterator[tuple[Gunicorn, Prometheus]]:
    with redis_server.client() as client:
        client.flushall()
    # "pay" configured: its consume and begin outcomes exist at 0 from the start
    server = Gunicorn(service_env(redis_server.url, TOKEN_SERVICE_METRIC_SCOPES="pay"), workers=2).start()
    prometheus = Prometheus(f"127.0.0.1:{server.port}")
    try:
        prometheus.start()
        yield server, prometheus
    finally:
        prometheus.stop()
        server.stop()


@pytest.mark.slow
def test_prometheus_scrapes_gunicorn_and_sees_a_duplicate_counted(
    scraped_service: tuple[Gunicorn, Prometheus],
) -> None:
    server, prometheus = scraped_service
    used = 'sum(token_service_token_outcomes_total{operation="consume",code="token_used"})'

    def value(expr: str) -> float | None:
        result = prometheus.query(expr)
        return float(result[0]["value"][1]) if result else None

    # scraped before any request: the series are there, at 0 (no "no data" for the alerts)
    wait_until(lambda: value(used) is not None, timeout_seconds=60, what="the first scrape")
    assert value(used) == 0
    assert value('up{job="token-service"}') == 1
    assert value("sum(token_service_redis_errors_total)") == 0
    assert value('count(token_service_redis_errors_total{route="/token/consume"})') == 1
    # Every rule reads series the real service exports, before any request: the promtool tests
    # feed the rules hand-written series, which would pass with a misspelt name or label.
    for rule in _rules():
        if "record" in rule and "token_service:" not in rule["expr"]:  # ratios read the records
            returns_a_series = lambda expr=rule["expr"]: prometheus.query(expr) != []  # noqa: E731
            wait_until(returns_a_series, timeout_seconds=60, what=rule["record"])

    with httpx.Client(base_url=server.url, timeout=10) as http:
        token = http.post("/token/generate", json={"scope": "pay"}).json()["token"]
        # a configured scope's use outcomes exist at 0 from the start; once scraped, rate() counts
        # the scope's very first duplicate (a series born at 1 hides its first increment from rate())
        scoped_used = 'token_service_token_outcomes_total{operation="consume",code="token_used",scope="pay"}'
        wait_until(lambda: value(scoped_used) == 0, timeout_seconds=60, what="the scope's zeros scraped")
        assert (
            http.post("/token/consume", json={"token": token, "scope": "pay"}, headers=AUTH).status_code
            == 200
        )
        again = http.post("/token/consume", json={"token": token, "scope": "pay"}, headers=AUTH)
        assert again.json()["code"] == "token_used"

    wait_until(lambda: value(used) == 1, timeout_seconds=60, what="the duplicate in Prometheus")
    assert value('sum(token_service_token_outcomes_total{operation="consume",code="consumed"})') == 1

    def loaded() -> list[dict[str, Any]]:
        groups = httpx.get(prometheus.url + "/api/v1/rules", timeout=5).json()["data"]["groups"]
        return [rule for group in groups for rule in group["rules"]]

    assert len([rule for rule in loaded() if rule["type"] == "alerting"]) == 6
    assert len([rule for rule in loaded() if rule["type"] == "recording"]) == 10
    # every rule evaluates without error on the real series (a vector-matching error would show here)
    wait_until(
        lambda: all(rule["health"] == "ok" for rule in loaded()), timeout_seconds=60, what="rules evaluated"
    )
    assert not [rule for rule in loaded() if rule.get("lastError")]
    # and the recorded series the dashboard plots and the alerts read move with the first duplicate
    wait_until(
        lambda: (value("token_service:duplicates:rate5m") or 0) > 0,
        timeout_seconds=60,
        what="the first duplicate in the recorded rate",
    )
    assert value(f"increase({scoped_used}[5m])") > 0  # type: ignore[operator]
    assert value("token_service:redis_errors:rate5m") == 0
    assert value('ALERTS{alertname=~"TokenService.*",alertstate="firing"}') is None
