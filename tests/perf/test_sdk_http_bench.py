"""benchmarks.sdk_http runs end to end in a tiny configuration (no speed is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from benchmarks import sdk_http

pytestmark = [pytest.mark.real, pytest.mark.slow]


def test_sdk_http_benchmark_measures_both_servers_in_alternating_rounds(tmp_path: Path) -> None:
    assert sdk_http.main(["--rounds", "2", "--calls", "5", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "sdk_http.json").read_text())
    assert set(result["schemes"]) == {"http", "https"}
    for figures in result["schemes"].values():
        assert len(figures["rounds"]) == 2
        for measured in figures["rounds"]:
            assert set(measured) == {"shipped", "sync"}
            assert all(ms > 0 for ms in measured.values())
        ratios = sorted(figures["ratios"])
        assert figures["ratio"] == pytest.approx(ratios[0] / 2 + ratios[1] / 2)


def test_the_tls_servers_answer_only_over_tls_with_the_runs_certificate() -> None:
    cert = sdk_http.SelfSignedCertificate().create()
    redis_server = sdk_http.RedisServer().start()
    env = {**sdk_http.ENV, "TOKEN_SERVICE_REDIS_URL": redis_server.url}
    server = sdk_http.TlsGunicorn("token_service:create_app()", env, 1, cert).start()
    try:
        assert server.url.startswith("https://")
        with pytest.raises(httpx.ConnectError):  # an untrusted certificate is refused
            httpx.get(server.url + "/healthz", timeout=5)
        assert httpx.get(server.url + "/healthz", verify=cert.client_context()).status_code == 200
    finally:
        server.stop()
        redis_server.stop()
        cert.remove()
