"""A FastAPI payment endpoint behind an anti-duplicate token: ``python -m examples.fastapi_app``."""
