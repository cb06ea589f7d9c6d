"""Serve the example on http://127.0.0.1:8300 (``PORT`` to change it) with Django's own server."""

import os
import sys

from django.core.management import execute_from_command_line

from examples._serving import port_or_exit
from token_service.config import masked_url

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_app.settings")
port = port_or_exit(8300, "example-django")
url = f"http://127.0.0.1:{port}"
redis_url = os.environ.get("TOKEN_SERVICE_REDIS_URL", "redis://127.0.0.1:6379/0")
print(
    f"""Payments (Django) on {url}; Redis {masked_url(redis_url)} (TOKEN_SERVICE_REDIS_URL to change it).
Try it from another shell: a token for an amount, a double click on Pay, then the bank's list (one charge):

  TOKEN=$(curl -s -X POST -H 'X-User-Id: ada' -H 'Content-Type: application/json' -d '{{"amount": 1250}}' \\
    {url}/checkout/token | cut -d'"' -f4)
  for click in 1 2; do curl -s -i -X POST -H 'X-User-Id: ada' -H "Idempotency-Token: $TOKEN" \\
    -H 'Content-Type: application/json' -d '{{"amount": 1250}}' {url}/payments & done; wait
  curl -s {url}/payments/list

The DRF API takes a key of the client's choosing instead (the second answer is replayed):

  KEY=order-$RANDOM; for try in 1 2; do curl -s -i -X POST -H 'Authorization: Bearer ada' \\
    -H "Idempotency-Key: \\"$KEY\\"" -H 'Content-Type: application/json' \\
    -d '{{"sku": "A1"}}' {url}/api/orders; done
""",
    flush=True,
)
execute_from_command_line([sys.argv[0], "runserver", "--noreload", f"127.0.0.1:{port}", *sys.argv[1:]])
