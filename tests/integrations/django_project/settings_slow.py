"""The test project with a 2 s Idempotency-Key lock and no waiting (test_django_renewal.py): a
duplicate of a request still running gets 409 at once, so a test tells a renewed claim from a lost one."""

from .settings import *  # noqa: F403
from .settings import TOKEN_SERVICE

TOKEN_SERVICE = {
    **TOKEN_SERVICE,
    "IDEMPOTENCY_KEY": {"PATHS": ["/api/"], "WAIT_SECONDS": 0, "LOCK_SECONDS": 2},
}
