"""openapi.yaml is valid OpenAPI 3.1 and lists exactly the app's routes."""

from __future__ import annotations

import re
from typing import Any

import yaml
from openapi_spec_validator import validate

from token_service.server.health import openapi_path

IGNORED_METHODS = {"HEAD", "OPTIONS"}


def _spec() -> dict[str, Any]:
    return yaml.safe_load(openapi_path().read_text())  # type: ignore[no-any-return]


def _flask_to_openapi(rule: str) -> str:
    # /static/<path:filename> → /static/{filename}
    return re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule)


def test_spec_is_valid_openapi_3_1() -> None:
    spec = _spec()
    assert spec["openapi"].startswith("3.1")
    validate(spec)


def test_spec_lists_exactly_the_apps_routes(app: Any) -> None:
    documented = {
        (method.upper(), path)
        for path, operations in _spec()["paths"].items()
        for method in operations
        if method in {"get", "post", "put", "patch", "delete"}
    }
    served = {
        (method, _flask_to_openapi(rule.rule))
        for rule in app.url_map.iter_rules()
        for method in rule.methods - IGNORED_METHODS
    }
    assert documented == served, f"only in spec: {documented - served}; only in app: {served - documented}"


def test_every_problem_code_of_the_errors_module_is_documented() -> None:
    from token_service.errors import ERRORS_BY_CODE

    documented = set(_spec()["components"]["schemas"]["Problem"]["properties"]["code"]["enum"])
    assert set(ERRORS_BY_CODE) <= documented


def test_served_spec_is_the_file(client: Any) -> None:
    response = client.get("/openapi.yaml")
    assert response.status_code == 200
    assert yaml.safe_load(response.data) == _spec()


def test_the_route_table_agrees_with_the_spec() -> None:
    from token_service.server.routes import ROUTES

    spec = _spec()
    default_security = spec.get("security", [])
    for route in ROUTES:
        operation = spec["paths"][route.path][route.method.lower()]
        assert operation["operationId"] == route.operation, route
        assert str(route.status) in operation["responses"], route
        assert bool(operation.get("security", default_security)) == route.needs_key, route


def test_the_route_table_is_what_the_app_serves(app: Any) -> None:
    from token_service.server.routes import ROUTES

    served = {(rule.rule, rule.endpoint.split(".")[-1]): rule.methods for rule in app.url_map.iter_rules()}
    for route in ROUTES:
        assert route.method in served[(route.path, route.endpoint)], route


# What gunicorn answers before the app sees the request (gunicorn.workers.base.handle_error,
# made problem+json by token_service/server/gunicorn_errors.py): any operation can meet them.
SERVER_STATUSES = {"400", "414", "417", "431", "501"}


def test_every_operation_documents_the_statuses_gunicorn_answers_before_the_app() -> None:
    # issue 26: a fuzzer flagged GET /admin/records with a long query answered 414, undocumented
    for path, operations in _spec()["paths"].items():
        for method, operation in operations.items():
            if method in {"get", "post", "put", "patch", "delete"}:
                missing = SERVER_STATUSES - set(operation["responses"])
                assert not missing, (method, path, missing)


def test_the_root_says_what_answers_and_where_to_read_on(client: Any) -> None:
    from token_service import __version__

    response = client.get("/")
    assert response.status_code == 200
    body = response.get_json()
    assert body["service"] == "token-service"
    assert body["version"] == __version__
    assert "docs/" in body["docs"]
    for path in body["links"].values():
        assert client.get(path).status_code == 200, path
