"""The example's settings, a complete file (docs/integrations/django.md shows it as it is).

``TOKEN_SERVICE`` is all the token service needs; the rest is the least a Django project
with Django REST framework runs on.
"""

import os

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-change-me")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "examples.django_app.urls"
INSTALLED_APPS = ["rest_framework"]
DATABASES: dict[str, object] = {}  # the example keeps its "bank" in Redis
REST_FRAMEWORK = {  # the example's API clients are their Authorization header (see below)
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
}

TOKEN_SERVICE = {
    "REDIS_URL": os.environ.get("TOKEN_SERVICE_REDIS_URL", "redis://127.0.0.1:6379/0"),
    # or, through the service's HTTP API: "URL": "http://token-service:8000", "API_KEY": "..."
    "IDEMPOTENCY_KEY": {  # the middleware
        "PATHS": ["/api/"],  # only under these prefixes (default: everywhere)
        "METHODS": ["POST", "PATCH"],
        "REQUIRED": True,  # a POST under /api/ without a key gets 400
        "TTL_SECONDS": 86400,  # how long a response is replayed
        "LOCK_SECONDS": 60,  # a dead request's key is free again after this
        "WAIT_SECONDS": 10,  # a duplicate waits this long for the first response (else 409)
    },
}
MIDDLEWARE = [
    "django.middleware.common.CommonMiddleware",
    # after your authentication middleware: keys are kept per client
    "token_service.client.django.IdempotencyKeyMiddleware",
]
