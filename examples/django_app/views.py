"""A checkout's token and a payment view (decorator), and a DRF orders API (middleware).

docs/integrations/django.md shows this file as it is. The "bank" is in Redis, not in the
process, so every gunicorn worker numbers and lists the same charges.
"""

from __future__ import annotations

import json

import redis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from rest_framework.response import Response
from rest_framework.views import APIView

from token_service.client import fields_fingerprint
from token_service.client.django import require_token, token_client

bank = redis.Redis.from_url(settings.TOKEN_SERVICE["REDIS_URL"], decode_responses=True)


def user(request: HttpRequest) -> str:
    return request.headers.get("X-User-Id", "anonymous")  # a real app: str(request.user.pk)


def charge(payment: dict[str, object], who: str) -> dict[str, object]:
    """The bank's side: one numbered charge, the same numbering in every worker."""
    made = {"id": f"pay_{bank.incr('examples:django:payments')}", "amount": payment["amount"], "user": who}
    bank.rpush("examples:django:charges", json.dumps(made))
    return made


@csrf_exempt
@require_POST
def checkout_token(request: HttpRequest) -> HttpResponse:
    """The checkout page's token: bound to the user and to the amount it shows."""
    payment = json.loads(request.body)
    bound = fields_fingerprint({"amount": payment["amount"]})
    issued = token_client().generate(
        "payment.create", subject=user(request), fingerprint=bound, ttl_seconds=900
    )
    return JsonResponse({"token": issued.token}, status=201, headers={"Cache-Control": "no-store"})


@csrf_exempt
@require_POST
@require_token("payment.create", subject=user, fingerprint=["amount"], wait_seconds=10)
def pay(request: HttpRequest) -> HttpResponse:
    made = charge(json.loads(request.body), user(request))
    return JsonResponse(made, status=201, headers={"Location": f"/payments/{made['id']}"})


@csrf_exempt
@require_POST
@require_token("payment.create", subject=user, fingerprint=["amount"], wait_seconds=10)
async def pay_async(request: HttpRequest) -> HttpResponse:
    made = await sync_to_async(charge)(json.loads(request.body), user(request))
    return JsonResponse(made, status=201, headers={"Location": f"/payments/{made['id']}"})


def payments(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"charges": [json.loads(c) for c in bank.lrange("examples:django:charges", 0, -1)]})


class Orders(APIView):
    """Django REST framework, under /api/: the Idempotency-Key middleware guards it."""

    def get(self, request: object) -> Response:
        return Response({"orders": [json.loads(o) for o in bank.lrange("examples:django:orders", 0, -1)]})

    def post(self, request: object) -> Response:
        order = {"id": f"o_{bank.incr('examples:django:order_ids')}", **request.data}  # type: ignore[attr-defined]
        bank.rpush("examples:django:orders", json.dumps(order))
        return Response(order, status=201)
