"""A Celery app whose tasks run once per key: ``python -m examples.celery_app`` shows it."""
