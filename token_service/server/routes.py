"""The token routes, once: path, operation, success status, who may call them.

The Flask blueprint (``api.py``) registers its views from this table, the
hot path (``hot_path.py``) answers the routes marked ``hot`` from it, and
CORS (``cors.py``) opens exactly the routes marked ``browser``. Each
``operation`` is the route's ``operationId`` in openapi.yaml
(tests/test_openapi.py holds the two to each other).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BEGIN",
    "COMPLETE",
    "CONSUME",
    "FAIL",
    "GENERATE",
    "GENERATE_BATCH",
    "INSPECT",
    "RENEW",
    "REVOKE",
    "ROUTES",
    "TOKEN_CLIENT_JS",
    "TOKEN_ROUTES",
    "Route",
]


@dataclass(frozen=True, slots=True)
class Route:
    path: str
    operation: str  # openapi.yaml's operationId
    endpoint: str  # the Flask view's name within its blueprint
    method: str = "POST"
    status: int = 200  # of a success
    needs_key: bool = True  # a service key (Authorization: Bearer); the frontend routes need none
    browser: bool = False  # called from pages: under the CORS allowlist
    hot: bool = False  # answered by the hot path in front of Flask (the plain case)


GENERATE = Route(
    "/token/generate", "generateToken", "generate", status=201, needs_key=False, browser=True, hot=True
)
GENERATE_BATCH = Route(
    "/token/generate/batch", "generateTokens", "generate_batch", status=201, needs_key=False, browser=True
)
CONSUME = Route("/token/consume", "consumeToken", "consume", hot=True)
BEGIN = Route("/token/begin", "beginOperation", "begin")
RENEW = Route("/token/renew", "renewLease", "renew")
COMPLETE = Route("/token/complete", "completeOperation", "complete")
FAIL = Route("/token/fail", "failOperation", "fail")
INSPECT = Route("/token/inspect", "inspectToken", "inspect")
REVOKE = Route("/token/revoke", "revokeToken", "revoke")
# The browser helper (server/frontend.py): loaded cross-origin as an ES module.
TOKEN_CLIENT_JS = Route(
    "/static/token-client.js", "tokenClientJs", "token_client_js", method="GET", needs_key=False, browser=True
)

TOKEN_ROUTES = (GENERATE, GENERATE_BATCH, CONSUME, BEGIN, RENEW, COMPLETE, FAIL, INSPECT, REVOKE)
ROUTES = (*TOKEN_ROUTES, TOKEN_CLIENT_JS)
