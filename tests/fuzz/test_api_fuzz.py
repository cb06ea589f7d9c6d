"""schemathesis: every operation of openapi.yaml fuzzed against the app, all checks.

The app runs in-process (WSGI) on a real redis-server. schemathesis generates
valid and invalid requests for each operation from openapi.yaml and runs every
check it has (no 5xx, status codes, content types, headers and bodies conform
to the spec, invalid data rejected, valid data accepted, auth enforced, ...).
Random tokens only ever reach "unknown token"; so that the success and
conflict replies are fuzzed too, a body hook swaps in real tokens the store
prepared in each state (fresh and bound to the request's own scope/subject/
fingerprint, bound to another scope, leased with the request's lease id, consumed,
succeeded, failed, held by another lease).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.support.service import API_KEY, AUTH
from token_service import create_app
from token_service.records import IssueRequest, UseRequest
from token_service.server.health import openapi_path
from token_service.store import TokenStore

EXAMPLES_PER_OPERATION = 100
MIN_REQUESTS = 1000
# the operations of openapi.yaml (test_openapi.py checks they are exactly the app's routes)
OPERATIONS = sum(
    method in {"get", "post", "put", "patch", "delete"}
    for operations in yaml.safe_load(openapi_path().read_text())["paths"].values()
    for method in operations
)

# Figures of the run: generated cases per operation, and every request the app served
# (checks such as ignored_auth send extra requests of their own).
CASES: Counter[str] = Counter()
SERVED: Counter[int] = Counter()


class _App:
    """The WSGI app under test, built by a fixture (on a real redis-server) once the tests run."""

    app: Any = None

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        def counting_start_response(status: str, headers: Any, *args: Any) -> Any:
            SERVED[int(status.split(" ", 1)[0])] += 1
            return start_response(status, headers, *args)

        return self.app(environ, counting_start_response)  # type: ignore[no-any-return]


APP = _App()
schema = schemathesis.openapi.from_path(openapi_path())
schema.app = APP


@pytest.fixture(scope="module", autouse=True)
def _app_on_real_redis(redis_server: Any) -> Iterator[None]:
    # no issuance limits: a batch over one is a 400 on `count` (tests/edge/test_limits.py), which
    # the schema cannot say (the limits are settings); without them every count it allows passes
    settings = {"rate_limit": "off", "max_outstanding_per_subject": 0}
    APP.app = create_app({"api_keys": API_KEY, "redis_url": redis_server.url, **settings})
    yield
    APP.app = None


# -- real tokens in every state -------------------------------------------------------
_SCOPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}\Z")
_TEXT = re.compile(r"[^\x00-\x1f\x7f]{1,128}\Z")
STATES = ["fresh", "mismatched", "leased", "consumed", "succeeded", "failed", "processing"]


def _store() -> TokenStore:
    store: TokenStore = APP.app.extensions["token_service"]["store"]
    return store


def _text_or_none(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    return value if isinstance(value, str) and _TEXT.match(value) else None


def _real_token(body: dict[str, Any], state: str) -> dict[str, Any]:
    """``body`` with its token (and lease id) replaced by a real one in ``state``."""
    store = _store()
    scope = body.get("scope")
    scope = scope if isinstance(scope, str) and _SCOPE.match(scope) else "fuzz.scope"
    subject, fingerprint = _text_or_none(body, "subject"), _text_or_none(body, "fingerprint")
    if state == "mismatched":
        [token] = store.issue(IssueRequest(scope + ".other", subject, fingerprint, 300))
        return {**body, "token": token}
    [token] = store.issue(IssueRequest(scope, subject, fingerprint, 300))
    lease_id = None
    if state != "fresh":
        if state == "consumed":
            store.consume(UseRequest(token, scope, subject, fingerprint))
        else:
            lease_id = store.begin(UseRequest(token, scope, subject, fingerprint)).lease_id  # type: ignore[union-attr]
            if state == "succeeded":
                store.complete(token, lease_id, {"order": 42, "note": "stored result"})
            elif state == "failed":
                store.fail(token, lease_id, retryable=False, error={"reason": "card declined"})
    mapped = {**body, "token": token}
    # only a lease id that was valid already: an invalid one is what a negative case tests
    if (
        state == "leased"
        and lease_id is not None
        and _text_or_none(body, "lease_id")
        and len(body["lease_id"]) <= 64
    ):
        mapped["lease_id"] = lease_id
    return mapped


@schema.hook
def flatmap_body(context: Any, body: Any) -> Any:
    if not isinstance(body, dict) or not isinstance(body.get("token"), str):
        return st.just(body)
    return st.sampled_from([None, *STATES]).map(
        lambda state: body if state is None else _real_token(body, state)
    )


# -- the fuzzing ----------------------------------------------------------------------
@schema.parametrize()
# derandomized: the same requests every run, so a CI failure always reproduces
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_api(case: Any) -> None:
    CASES[case.operation.label] += 1
    if case.operation.label == "GET /openapi.yaml":
        # its 200 is the document's text (a string of YAML, as generators read it), which
        # schemathesis would parse into an object and hold against `type: string`: the text is
        # checked as what it is, the file, and every other check runs as for the rest
        response = case.call_and_validate(headers=AUTH, excluded_checks=[response_schema_conformance])
        if response.status_code == 200 and response.request.method == "GET":
            assert response.text == openapi_path().read_text(encoding="utf-8")
        return
    case.call_and_validate(headers=AUTH)


def test_fuzzing_covered_every_operation() -> None:
    """Runs after test_api (file order): the run generated enough requests, and no 5xx."""
    if len(CASES) < OPERATIONS:
        pytest.skip("only part of the fuzzing ran (-k / -m selection)")
    print(f"schemathesis: {sum(CASES.values())} generated cases, {sum(SERVED.values())} requests served")
    print(f"  per operation: {dict(CASES)}")
    print(f"  statuses: {dict(sorted(SERVED.items()))}")
    assert sum(CASES.values()) >= MIN_REQUESTS
    assert not [status for status in SERVED if status >= 500]
    # the prepared tokens reached the success and conflict paths, not only 404s
    assert {200, 201, 400, 401, 403, 404, 409} <= set(SERVED)
