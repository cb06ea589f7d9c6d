"""openapi.yaml is valid OpenAPI 3.1 and lists exactly the app's routes."""

from __future__ import annotations

import re
from typing import Any

import yaml
from openapi_spec_validator import validate

from token_service import create_app
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


# What tools generating clients read (issue 33): each finding held here, on the document itself;
# tests/contract/ runs the generators and their clients against the service.


def _operations() -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, operation)
        for path, operations in _spec()["paths"].items()
        for method, operation in operations.items()
        if method in {"get", "post", "put", "patch", "delete"}
    ]


def _resolved(spec: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in item:
        name = item["$ref"].rsplit("/", 1)[1]
        return spec["components"]["responses"][name]  # type: ignore[no-any-return]
    return item


def test_every_operation_says_its_own_security() -> None:
    # openapi-python-client ignores the top-level `security`: without its own, a backend operation
    # was generated for an unauthenticated client
    for method, path, operation in _operations():
        assert "security" in operation, (method, path)
        schemes = {name for requirement in operation["security"] for name in requirement}
        expected = {"backend": {"serviceKey"}, "admin": {"adminKey"}}.get(operation["tags"][0], set())
        assert schemes == expected, (method, path, schemes)


def test_every_operation_documents_the_safety_nets() -> None:
    # 500 internal_error (a bug, a worker killed by its timeout) and 405 (the path, another method)
    spec = _spec()
    for method, path, operation in _operations():
        for status, code in (("500", "internal_error"), ("405", "method_not_allowed")):
            assert status in operation["responses"], (method, path, status)
            assert code in _resolved(spec, operation["responses"][status])["description"]
    codes = spec["components"]["schemas"]["Problem"]["properties"]["code"]["enum"]
    assert {"internal_error", "method_not_allowed", "not_found"} <= set(codes)


def test_every_response_declares_the_request_id_header(client: Any) -> None:
    spec = _spec()
    for method, path, operation in _operations():
        for status, item in operation["responses"].items():
            headers = _resolved(spec, item).get("headers", {})
            assert headers.get("X-Request-ID") == {"$ref": "#/components/headers/RequestId"}, (
                method,
                path,
                status,
            )
    declared = spec["components"]["headers"]["RequestId"]
    assert declared["required"] is True
    pattern = re.compile(declared["schema"]["pattern"])
    # as the service sends it: its own id, or the caller's when it is sane
    for sent, echoed in ((None, False), ("order-7:retry.2", True), ("x" * 129, False)):
        reply = client.get("/healthz", headers={"X-Request-ID": sent} if sent else {})
        assert pattern.match(reply.headers["X-Request-ID"])
        assert (reply.headers["X-Request-ID"] == sent) is echoed


def test_codes_and_fields_are_typed_strings() -> None:
    # openapi-typescript: an enum without a type is `@enum {unknown}`
    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if "enum" in node or "const" in node:
                assert "type" in node, where
            for key, value in node.items():
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for number, value in enumerate(node):
                walk(value, f"{where}/{number}")

    walk(_spec(), "#")


def test_field_errors_are_described_as_the_service_sends_them(client: Any) -> None:
    errors = _spec()["components"]["schemas"]["Problem"]["properties"]["errors"]
    assert errors["additionalProperties"] == {"type": "array", "items": {"type": "string"}}
    refused = client.post("/token/generate", json={"scope": "", "colour": "red"})
    assert refused.status_code == 400
    body = refused.get_json()
    assert set(body["errors"]) == {"scope", "colour"}, body
    for messages in body["errors"].values():
        assert isinstance(messages, list), body
        assert messages, body
        assert all(isinstance(message, str) for message in messages), body


def test_the_ref_parameter_is_what_the_admin_routes_take(redis_client: Any) -> None:
    # the spec said 6-22 characters; only a full ref (22) names one record, a shorter one is a 400
    admin = "admin-key-for-the-openapi-tests-01"
    http = create_app(
        {"api_keys": "k" * 32, "admin_keys": admin, "redis_client": redis_client, "rate_limit": "off"}
    ).test_client()
    pattern = re.compile(_spec()["components"]["parameters"]["Ref"]["schema"]["pattern"])
    for length in (6, 8, 21, 22, 23):
        ref = "A" * length
        documented = bool(pattern.match(ref))
        answered = http.get(f"/admin/records/{ref}", headers={"Authorization": f"Bearer {admin}"})
        assert answered.status_code in (400, 404), (length, answered.status_code)
        assert (answered.status_code == 404) is documented, (length, answered.get_json())
