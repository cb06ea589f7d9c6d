"""A small payment API protected by ``@require_token``: a double-clicked "Pay" charges once.

Run it against a token service (``TOKEN_SERVICE_URL`` + ``TOKEN_SERVICE_API_KEY``)
or straight against its Redis (``TOKEN_SERVICE_REDIS_URL``)::

    TOKEN_SERVICE_REDIS_URL=redis://localhost:6379/0 python -m examples.payment_api

Routes (the caller's identity is the ``X-User-Id`` header, standing in for a session):

- ``POST /checkout/token`` — a one-time ``payment.create`` token bound to the user
  (a frontend may equally ask the token service's ``/token/generate`` itself);
- ``POST /payments`` — ``{"amount": 1250, "currency": "EUR"}`` with the token in
  ``Idempotency-Token``: charges once; duplicates get the same 201 (or 402) back
  with ``Idempotent-Replayed: true``;
- ``GET /payments/<id>``.
"""

from examples.payment_api.app import Bank, CardDeclined, create_app

__all__ = ["Bank", "CardDeclined", "create_app"]
