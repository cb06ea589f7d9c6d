"""A minimal Django project for tests/integrations/test_django.py (Redis from TS_TEST_REDIS_URL)."""

import os

SECRET_KEY = "tests-only-not-a-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "tests.integrations.django_project.urls"
INSTALLED_APPS = ["rest_framework"]
DATABASES: dict[str, object] = {}
USE_TZ = True
MIDDLEWARE = [
    "django.middleware.common.CommonMiddleware",
    "token_service.client.django.IdempotencyKeyMiddleware",
]
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
}
# the test's Redis: the views count their runs there, whichever Redis the token service is given
COUNTERS_REDIS_URL = os.environ.get("TS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
TOKEN_SERVICE = {
    # a dead one (TS_TEST_TOKENS_REDIS_URL): @require_token's clients of these settings answer 503
    "REDIS_URL": os.environ.get("TS_TEST_TOKENS_REDIS_URL", COUNTERS_REDIS_URL),
    "IDEMPOTENCY_KEY": {
        "PATHS": ["/api/"],
        # a duplicate waits for the first request's response (0: it gets 409 at once)
        "WAIT_SECONDS": float(os.environ.get("TS_TEST_IK_WAIT_SECONDS", "30")),
        "LOCK_SECONDS": 10,
    },
}
if os.environ.get("TS_TEST_IK_REDIS_URL"):  # the middleware's own store (a dead one: fail closed)
    TOKEN_SERVICE["IDEMPOTENCY_KEY"]["REDIS_URL"] = os.environ["TS_TEST_IK_REDIS_URL"]  # type: ignore[index]
