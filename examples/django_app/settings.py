"""The example's settings: TOKEN_SERVICE is all the token service needs."""

import os

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-change-me")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "examples.django_app.urls"
INSTALLED_APPS = ["rest_framework"]
DATABASES: dict[str, object] = {}  # the example keeps its "bank" in memory
MIDDLEWARE = [
    "django.middleware.common.CommonMiddleware",
    # after your authentication middleware: a key is kept per client
    "token_service.client.django.IdempotencyKeyMiddleware",
]
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
}
TOKEN_SERVICE = {
    "REDIS_URL": os.environ.get("TOKEN_SERVICE_REDIS_URL", "redis://127.0.0.1:6379/0"),
    "IDEMPOTENCY_KEY": {
        "PATHS": ["/api/"],  # the DRF API takes Idempotency-Key; the rest is left alone
        "WAIT_SECONDS": 10,
    },
}
