"""The helper as an npm package: its Node unit tests, an install from the repository path, its types
checked by tsc (Debian's ``node-typescript``), one source.

``frontend/`` is the package (ES module, ``.d.ts`` types, ``package.json``;
private, never published). Its unit tests run under Node's built-in test
runner; this module runs them so pytest's summary counts them. The service
serves the same file: from the wheel's copy when installed, from
``frontend/`` in an editable checkout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT
from token_service.server.frontend import asset, asset_path

# slow: npm, Node's test runner and tsc (~55 s)
pytestmark = pytest.mark.slow

PACKAGE = REPO_ROOT / "frontend"


def _tool(name: str, package: str = "nodejs npm") -> str:
    path = shutil.which(name)
    if path is None:
        reason = f"{name} is missing: apt-get install {package} to run the helper's tests"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} — CI must run them", pytrace=False)
        pytest.skip(reason)
    return path


def test_the_node_unit_tests_pass() -> None:
    result = subprocess.run(
        [_tool("node"), "--test"],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1"},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    counts = dict(re.findall(r"^# (pass|fail|cancelled|skipped|todo) (\d+)$", output, re.MULTILINE))
    assert counts["fail"] == "0", output
    assert counts["cancelled"] == counts["skipped"] == counts["todo"] == "0", output
    assert int(counts["pass"]) >= 20, output
    print(f"node --test: {counts['pass']} passed")


def test_npm_installs_the_package_from_the_repository_path(tmp_path: Path) -> None:
    shop = tmp_path / "shop"
    shop.mkdir()
    (shop / "package.json").write_text(json.dumps({"name": "shop", "private": True, "type": "module"}))
    install = subprocess.run(
        [_tool("npm"), "install", "--offline", "--no-audit", "--no-fund", str(PACKAGE)],
        cwd=shop,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    script = (
        "import TokenClient, { isReplayed, NetworkError } from 'token-service-client';"
        "const c = new TokenClient({ baseUrl: 'https://tokens.example/' });"
        "console.log(JSON.stringify({ base: c.baseUrl, action: typeof c.action('s').token,"
        " network: new NetworkError('x', { stage: 'token' }).stage, replayed: isReplayed(null) }));"
    )
    run = subprocess.run(
        [_tool("node"), "--input-type=module", "-e", script],
        cwd=shop,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {
        "base": "https://tokens.example/",
        "action": "function",
        "network": "token",
        "replayed": False,
    }
    manifest = json.loads((PACKAGE / "package.json").read_text())
    assert manifest["private"] is True  # installable from the path, never published
    assert manifest["exports"]["."] == {"types": "./token-client.d.ts", "default": "./token-client.js"}
    installed = shop / "node_modules" / "token-service-client"
    assert (installed / "token-client.d.ts").is_file()


# A shop's TypeScript, as docs/frontend.md uses the helper: it must compile against the .d.ts
# (strict, no skipLibCheck), and the lines marked @ts-expect-error must not: the types are real,
# not `any` (tsc would flag an unused @ts-expect-error).
SHOP_TS = """\
import TokenClient, {
  DuplicateRequestError, NetworkError, RateLimitedError, TokenAction, TokenClientError,
  getToken, idempotentFetch, isReplayed, type IssuedToken, type RetryInfo,
} from "token-service-client";

const tokens = new TokenClient({
  baseUrl: "https://tokens.example.com",
  onRetry: ({ attempt, reason, delayMs, stage }: RetryInfo) => console.log(attempt, reason, delayMs, stage),
});
const order: TokenAction = tokens.action("payment.create", { subject: "shopper-1", fingerprint: "ord_1" });

export async function pay(): Promise<string> {
  const token: string = await order.token();
  try {
    const response = await order.fetch("/api/orders/ord_1/charge", { method: "POST", body: "{}" }, {
      onRetry: (retry) => console.log(retry.stage === "request" && retry.reason === "network"),
    });
    return isReplayed(response) ? "already paid" : `paid with ${token.length}-character token`;
  } catch (error) {
    if (error instanceof RateLimitedError) return `wait ${error.retryAfterSeconds ?? 30} s`;
    if (error instanceof NetworkError && error.stage === "token") return "not charged";
    if (error instanceof DuplicateRequestError) return error.code;
    if (error instanceof TokenClientError) return String(error.status);
    throw error;
  }
}

export async function alone(): Promise<number> {
  const issued: IssuedToken = await getToken("payment.create", { baseUrl: "https://tokens.example.com" });
  const response = await idempotentFetch("/api/x", { method: "POST" }, { scope: "payment.create" });
  return issued.ttl_seconds + response.status + order.attempts + order.renewals;
}

// @ts-expect-error a scope is required
idempotentFetch("/api/x", {}, {});
// @ts-expect-error an action's token is a string
export const wrong: Promise<number> = order.token();
// @ts-expect-error no such option
new TokenClient({ baseURL: "https://tokens.example.com" });
"""
TSCONFIG = {
    "compilerOptions": {
        "strict": True,
        "noEmit": True,
        "skipLibCheck": False,
        "target": "es2022",
        "lib": ["es2022", "dom"],
        "module": "node16",
        "moduleResolution": "node16",
    },
    "files": ["shop.ts"],
}


def test_a_shops_typescript_checks_against_the_types(tmp_path: Path) -> None:
    shop = tmp_path / "shop"
    shop.mkdir()
    (shop / "package.json").write_text(json.dumps({"name": "shop", "private": True, "type": "module"}))
    install = subprocess.run(
        [_tool("npm"), "install", "--offline", "--no-audit", "--no-fund", str(PACKAGE)],
        cwd=shop,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    (shop / "tsconfig.json").write_text(json.dumps(TSCONFIG))
    (shop / "shop.ts").write_text(SHOP_TS)
    tsc = _tool("tsc", package="node-typescript")
    checked = subprocess.run([tsc, "-p", "."], cwd=shop, capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # The same file with a type error: tsc does look at the types.
    (shop / "shop.ts").write_text(SHOP_TS + "export const n: number = new TokenClient();\n")
    broken = subprocess.run([tsc, "-p", "."], cwd=shop, capture_output=True, text=True, timeout=120)
    assert broken.returncode != 0
    assert "Type 'TokenClient' is not assignable to type 'number'" in broken.stdout


def test_a_checkout_serves_the_package_file(client: object) -> None:
    assert asset_path() == PACKAGE / "token-client.js"
    response = client.get("/static/token-client.js")  # type: ignore[attr-defined]
    assert response.data == (PACKAGE / "token-client.js").read_bytes()


def test_the_wheel_carries_the_package_file_and_serves_its_copy(tmp_path: Path) -> None:
    pytest.importorskip("hatchling", reason="hatchling builds the wheel")
    from hatchling.builders.wheel import WheelBuilder

    wheel = next(iter(WheelBuilder(str(REPO_ROOT)).build(directory=str(tmp_path), versions=["standard"])))
    unpacked = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(unpacked)
    copy = unpacked / "token_service" / "frontend" / "token-client.js"
    assert copy.read_bytes() == (PACKAGE / "token-client.js").read_bytes()
    # The unpacked wheel first on the path: the installed package serves its own copy.
    probe = subprocess.run(
        [sys.executable, "-c", "from token_service.server.frontend import asset_path; print(asset_path())"],
        env={**os.environ, "PYTHONPATH": str(unpacked)},
        cwd=tmp_path,  # not the checkout: `python -c` puts the working directory first on the path
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr
    assert Path(probe.stdout.strip()) == copy
    assert asset()[0] == copy.read_bytes()
