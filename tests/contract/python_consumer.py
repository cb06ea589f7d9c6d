"""A backend written against the client openapi-python-client generates from openapi.yaml.

tests/contract/test_generated_clients.py generates ``token_service_client`` with the command of
docs/http-api.md, type-checks this file against it (``mypy --strict``) and runs it against the
service; it prints what it saw as one JSON document, which the test holds to the contract.
Written as a user would: the generated functions and models only, no hand-made requests.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from token_service_client import AuthenticatedClient, Client
from token_service_client.api.admin import admin_show_record
from token_service_client.api.backend import begin_operation, complete_operation, consume_token
from token_service_client.api.frontend import generate_token
from token_service_client.api.operations import openapi
from token_service_client.models import (
    AdminRecord,
    BeginRequest,
    Completed,
    CompleteRequest,
    Consumed,
    ConsumeRequest,
    GenerateRequest,
    IssuedToken,
    Problem,
    ProblemCode,
    RecordState,
    ReplayedResult,
    Started,
)
from token_service_client.types import Unset

SCOPE = "payment.create"


def issued(frontend: Client, **fields: Any) -> IssuedToken:
    reply = generate_token.sync(client=frontend, body=GenerateRequest(scope=SCOPE, **fields))
    assert isinstance(reply, IssuedToken), reply
    return reply


def walk_through(frontend: Client, backend: AuthenticatedClient) -> dict[str, Any]:
    """The README's walk-through: generate, consume, and the duplicate's 409 read as a Problem."""
    token = issued(frontend, subject="shopper-1")
    use = ConsumeRequest(token=token.token, scope=SCOPE, subject="shopper-1", request_id="order-1")
    won = consume_token.sync(client=backend, body=use)
    assert isinstance(won, Consumed), won
    retried = consume_token.sync(client=backend, body=use)  # the same request_id: its own win again
    assert isinstance(retried, Consumed), retried
    duplicate = consume_token.sync_detailed(
        client=backend, body=ConsumeRequest(token=token.token, scope=SCOPE, subject="shopper-1")
    )
    problem = duplicate.parsed
    assert isinstance(problem, Problem), duplicate
    ref = problem.token_ref if isinstance(problem.token_ref, str) else None
    return {
        "issued": {
            "token_chars": len(token.token),
            "ttl_seconds": token.ttl_seconds,
            "subject": token.subject,
        },
        "consumed": {"outcome": won.outcome, "replayed": won.replayed},
        "retry": {"outcome": retried.outcome, "replayed": retried.replayed},
        "duplicate": {
            "http_status": int(duplicate.status_code),
            "status": problem.status,
            "code": problem.code.value,
            "is_token_used": problem.code is ProblemCode.TOKEN_USED,
            "title": problem.title,
            "token_ref": ref,
            "request_id": duplicate.headers.get("X-Request-ID"),
        },
    }


def field_errors(frontend: Client) -> dict[str, Any]:
    """A 400's field errors: field → list of messages, through the generated model."""
    refused = generate_token.sync_detailed(client=frontend, body=GenerateRequest(scope="no spaces allowed"))
    problem = refused.parsed
    assert isinstance(problem, Problem), refused
    assert not isinstance(problem.errors, Unset), problem
    messages: dict[str, list[str]] = problem.errors.additional_properties
    return {"http_status": int(refused.status_code), "code": problem.code.value, "errors": messages}


def two_phase(frontend: Client, backend: AuthenticatedClient) -> dict[str, Any]:
    """begin → complete, then a duplicate's begin gets the stored result back."""
    token = issued(frontend, fingerprint="order-7")
    begin = BeginRequest(token=token.token, scope=SCOPE, fingerprint="order-7", request_id="pay-7")
    started = begin_operation.sync(client=backend, body=begin)
    assert isinstance(started, Started), started
    result = {"charge": "ch_7", "amount_cents": 1250}
    completed = complete_operation.sync(
        client=backend, body=CompleteRequest(token=token.token, lease_id=started.lease_id, result=result)
    )
    assert isinstance(completed, Completed), completed
    duplicate = BeginRequest(token=token.token, scope=SCOPE, fingerprint="order-7", request_id="pay-7-again")
    replay = begin_operation.sync(client=backend, body=duplicate)
    assert isinstance(replay, ReplayedResult), replay
    return {
        "started": {"outcome": started.outcome, "lease_seconds": started.lease_seconds},
        "completed": {"outcome": completed.outcome, "replayed": completed.replayed},
        "replay": {"outcome": replay.outcome, "replayed": replay.replayed, "result": replay.result},
    }


def admin_record(admin: AuthenticatedClient, ref: str) -> dict[str, Any]:
    """The operators' view of the duplicate's record, by the token_ref its problem carried."""
    record = admin_show_record.sync(ref, client=admin)
    assert isinstance(record, AdminRecord), record
    return {
        "kind": record.kind.value,
        "ref": record.ref,
        "state": record.state.value,
        "is_consumed": record.state is RecordState.CONSUMED,
        "scope": record.scope,
        "request_id": record.request_id,
    }


def unauthenticated(base_url: str) -> dict[str, Any]:
    """A backend operation takes only an AuthenticatedClient: mypy refuses a plain Client
    (the ignore below is needed, or --strict reports it unused); the service answers 401."""
    anonymous = Client(base_url=base_url)
    token = issued(anonymous)
    refused = consume_token.sync_detailed(
        client=anonymous,  # type: ignore[arg-type]
        body=ConsumeRequest(token=token.token, scope=SCOPE),
    )
    problem = refused.parsed
    assert isinstance(problem, Problem), refused
    return {"http_status": int(refused.status_code), "code": problem.code.value}


def the_document(frontend: Client) -> dict[str, Any]:
    """GET /openapi.yaml: the document's text (it was generated as an object to parse)."""
    text: str | Problem | None = openapi.sync(client=frontend)
    assert isinstance(text, str), text
    return {"starts": text.split("\n", 1)[0], "chars": len(text)}


def main() -> None:
    base_url = os.environ["TOKEN_SERVICE_URL"]
    frontend = Client(base_url=base_url, raise_on_unexpected_status=True)
    backend = AuthenticatedClient(base_url=base_url, token=os.environ["TOKEN_SERVICE_API_KEY"])
    admin = AuthenticatedClient(base_url=base_url, token=os.environ["TOKEN_SERVICE_ADMIN_KEY"])
    seen: dict[str, Any] = {"walk_through": walk_through(frontend, backend)}
    seen["field_errors"] = field_errors(frontend)
    seen["two_phase"] = two_phase(frontend, backend)
    ref = seen["walk_through"]["duplicate"]["token_ref"]
    seen["admin"] = admin_record(admin, ref)
    seen["unauthenticated"] = unauthenticated(base_url)
    seen["document"] = the_document(frontend)
    json.dump(seen, sys.stdout)


if __name__ == "__main__":
    main()
