"""A checkout's token and a payment view (decorator), and a DRF orders API (middleware)."""

from __future__ import annotations

import itertools
import json
import threading

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from rest_framework.response import Response
from rest_framework.views import APIView

from token_service.client.django import require_token, token_client

charges: list[dict[str, object]] = []  # stands in for a bank
orders: list[dict[str, object]] = []
_ids = itertools.count(1)
_lock = threading.Lock()


def user(request: HttpRequest) -> str:
    return request.headers.get("X-User-Id", "anonymous")  # a real app: str(request.user.pk)


@csrf_exempt
@require_POST
def checkout_token(request: HttpRequest) -> HttpResponse:
    issued = token_client().generate("payment.create", subject=user(request), ttl_seconds=900)
    return JsonResponse({"token": issued.token}, status=201, headers={"Cache-Control": "no-store"})


@csrf_exempt
@require_POST
@require_token("payment.create", subject=user, wait_seconds=10)
def pay(request: HttpRequest) -> HttpResponse:
    payment = json.loads(request.body)
    with _lock:
        charge = {"id": f"pay_{next(_ids)}", "amount": payment["amount"], "user": user(request)}
        charges.append(charge)
    return JsonResponse(charge, status=201, headers={"Location": f"/payments/{charge['id']}"})


def payments(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"charges": charges})


class OrdersView(APIView):
    """Django REST framework, behind the Idempotency-Key middleware (TOKEN_SERVICE["IDEMPOTENCY_KEY"])."""

    def get(self, request: object) -> Response:
        return Response({"orders": orders})

    def post(self, request: object) -> Response:
        with _lock:
            order = {"id": f"o_{len(orders) + 1}", **request.data}  # type: ignore[attr-defined]
            orders.append(order)
        return Response(order, status=201)
