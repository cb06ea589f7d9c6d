"""A FastAPI payment endpoint behind an anti-duplicate token: ``python -m examples.fastapi_app``."""

import os

import uvicorn

from examples.fastapi_app.app import REDIS_URL
from token_service.config import masked_url

port = int(os.environ.get("PORT", "8000"))
url = f"http://127.0.0.1:{port}"
print(
    f"""Payments (FastAPI) on {url}; Redis {masked_url(REDIS_URL)} (TOKEN_SERVICE_REDIS_URL to change it).
Try it from another shell: a token, then a double click on Pay, then the bank's list (one charge):

  TOKEN=$(curl -s -X POST -H 'X-User-Id: ada' {url}/checkout/token | cut -d'"' -f4)
  for click in 1 2; do curl -s -i -X POST -H 'X-User-Id: ada' -H "Idempotency-Token: $TOKEN" \\
    -H 'Content-Type: application/json' -d '{{"amount": 1250, "currency": "EUR"}}' {url}/payments & done; wait
  curl -s {url}/payments
""",
    flush=True,
)
uvicorn.run("examples.fastapi_app.app:app", host="127.0.0.1", port=port)
