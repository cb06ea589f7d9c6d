"""``make example-fastapi`` (or ``.venv/bin/python -m examples.fastapi_app``): the FastAPI example
on http://127.0.0.1:8200 (``PORT`` to change it), with uvicorn."""

import uvicorn

from examples._serving import port_or_exit
from examples.fastapi_app.app import REDIS_URL
from token_service.config import masked_url

port = port_or_exit(8200, "example-fastapi")
url = f"http://127.0.0.1:{port}"
print(
    f"""Payments (FastAPI) on {url}; Redis {masked_url(REDIS_URL)} (TOKEN_SERVICE_REDIS_URL to change it).
Try it from another shell: a token for 12.50 EUR, a double click on Pay, then the bank's list (one charge):

  PAYMENT='{{"amount": 1250, "currency": "EUR"}}'
  TOKEN=$(curl -s -X POST -H 'X-User-Id: ada' -H 'Content-Type: application/json' -d "$PAYMENT" \\
    {url}/checkout/token | cut -d'"' -f4)
  for click in 1 2; do curl -s -i -X POST -H 'X-User-Id: ada' -H "Idempotency-Token: $TOKEN" \\
    -H 'Content-Type: application/json' -d "$PAYMENT" {url}/payments & done; wait
  curl -s {url}/payments

The same token for another amount is refused (403 token_mismatch):

  curl -s -X POST -H 'X-User-Id: ada' -H "Idempotency-Token: $TOKEN" \\
    -H 'Content-Type: application/json' -d '{{"amount": 1, "currency": "EUR"}}' {url}/payments
""",
    flush=True,
)
uvicorn.run("examples.fastapi_app.app:app", host="127.0.0.1", port=port)
