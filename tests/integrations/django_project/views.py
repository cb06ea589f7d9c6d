"""Views guarded by @require_token (sync, async, DRF) and by the Idempotency-Key middleware (/api/)."""

from __future__ import annotations

import asyncio
import io
import json
import time
from typing import Any

import redis
from django.conf import settings
from django.http import (
    FileResponse,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    JsonResponse,
    StreamingHttpResponse,
)
from rest_framework.response import Response
from rest_framework.views import APIView

from token_service.client.django import require_token

# a socket timeout past the slow views' 30 s BLPOP (redis-py 8 defaults to 5 s: a loaded machine
# releases them later than that)
counters = redis.Redis.from_url(settings.COUNTERS_REDIS_URL, socket_timeout=40)


class Declined(Exception):
    pass


def user(request: HttpRequest) -> str | None:
    return request.headers.get("X-User-Id")


def healthz(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"status": "ok"})


@require_token("payment.create", subject=user, fingerprint=["amount", "currency"])
def pay(request: HttpRequest) -> HttpResponse:
    run = counters.incr("runs:pay")
    time.sleep(0.3)
    payment = json.loads(request.body)
    response = JsonResponse({"id": f"pay_{run}", **payment}, status=201)
    response["Location"] = f"/payments/pay_{run}"
    response["X-Not-Replayed"] = "only the first answer has it"
    return response


@require_token("payment.create", subject=user, wait_seconds=30)
def pay_waiting(request: HttpRequest) -> HttpResponse:
    run = counters.incr("runs:pay_waiting")
    time.sleep(0.5)
    return JsonResponse({"id": f"pay_{run}"}, status=201)


@require_token("payment.create", subject=user, wait_seconds=30)
async def pay_async(request: HttpRequest) -> HttpResponse:
    run = await asyncio.to_thread(counters.incr, "runs:pay_async")
    await asyncio.sleep(0.5)
    return JsonResponse({"id": f"pay_{run}"}, status=201)


@require_token("declined.op", terminal=(Declined,))
def declined(request: HttpRequest) -> HttpResponse:
    counters.incr("runs:declined")
    raise Declined("card declined")


@require_token("crash.op")
def crash(request: HttpRequest) -> HttpResponse:
    run = counters.incr("runs:crash")
    if run == 1:
        raise RuntimeError("bug")
    return JsonResponse({"run": run})


# the settings' client for the running event loop, as the docs advise for an async view: served with
# TS_TEST_TOKENS_REDIS_URL pointing at a dead Redis, it answers 503 (test_django.py)
@require_token("down.op")
async def store_down(request: HttpRequest) -> HttpResponse:
    counters.incr("runs:down")
    return JsonResponse({})


class PaymentView(APIView):
    """Django REST framework: the view is decorated where it is routed (urls.py)."""

    def post(self, request: object) -> Response:
        run = counters.incr("runs:drf")
        return Response({"id": f"pay_{run}"}, status=201)


def create_order(request: HttpRequest) -> HttpResponse:
    run = counters.incr("runs:orders")
    body = json.loads(request.body)
    time.sleep(float(body.get("sleep", 0.5)))
    return JsonResponse({"order": f"o_{run}", "body": body}, status=201)


async def create_order_async(request: HttpRequest) -> HttpResponse:
    run = await asyncio.to_thread(counters.incr, "runs:orders_async")
    await asyncio.sleep(0.5)
    return JsonResponse({"order": f"o_{run}"}, status=201)


def unavailable_order(request: HttpRequest) -> HttpResponse:
    run = counters.incr("runs:orders_503")
    return JsonResponse({"run": run}, status=503 if run == 1 else 201)


# -- slower than their 2 s lease / lock (tests/integrations/test_django_renewal.py) ----------------
SLOW_LEASE_SECONDS = 2


def _first_waits_for_release(name: str) -> int:
    """Counts the run in ``runs:<name>``; the first one lasts until the test pushes ``release:<name>``."""
    run = int(counters.incr(f"runs:{name}"))
    if run == 1:
        counters.blpop([f"release:{name}"], timeout=30)
    return run


def slow_order(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"run": _first_waits_for_release("slow_order")}, status=201)


async def slow_order_async(request: HttpRequest) -> HttpResponse:
    run = await asyncio.to_thread(_first_waits_for_release, "slow_order_async")
    return JsonResponse({"run": run}, status=201)


@require_token("report.build", lease_seconds=SLOW_LEASE_SECONDS)
def slow_report(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"run": _first_waits_for_release("slow_report")}, status=201)


@require_token("report.build", lease_seconds=SLOW_LEASE_SECONDS)
async def slow_report_async(request: HttpRequest) -> HttpResponse:
    run = await asyncio.to_thread(_first_waits_for_release, "slow_report_async")
    return JsonResponse({"run": run}, status=201)


def crashing_order(request: HttpRequest) -> HttpResponse:
    run = counters.incr("runs:orders_crash")
    if run == 1:
        raise RuntimeError("bug")  # Django answers 500: not stored, the key is freed
    return JsonResponse({"run": run}, status=201)


# -- every kind of response (tests/integrations/test_django_response_kinds.py) ----------------------
REPORT = b"%PDF-1.4 receipt " * 4096  # 68 KB: over what a token's result keeps


def _report_file(request: HttpRequest, name: str) -> HttpResponseBase:
    counters.incr(f"runs:{name}")
    return FileResponse(io.BytesIO(REPORT), content_type="application/pdf", filename="report.pdf")


def _report_stream(request: HttpRequest, name: str) -> HttpResponseBase:
    counters.incr(f"runs:{name}")
    return StreamingHttpResponse((b"line %04d\n" % n for n in range(100)), content_type="text/plain")


def _status(request: HttpRequest, name: str) -> HttpResponseBase:
    counters.incr(f"runs:{name}")
    status = int(request.GET["status"])
    return JsonResponse({"status": status}, status=status)


def keyed_file(request: HttpRequest) -> HttpResponseBase:
    return _report_file(request, "keyed_file")


def keyed_stream(request: HttpRequest) -> HttpResponseBase:
    return _report_stream(request, "keyed_stream")


def keyed_status(request: HttpRequest) -> HttpResponseBase:
    return _status(request, "keyed_status")


@require_token("report.create")
def token_file(request: HttpRequest) -> HttpResponseBase:
    return _report_file(request, "token_file")


@require_token("report.create")
def token_stream(request: HttpRequest) -> HttpResponseBase:
    return _report_stream(request, "token_stream")


@require_token("report.create")
def token_status(request: HttpRequest) -> HttpResponseBase:
    return _status(request, "token_status")


# -- the guard's hooks, passed through @require_token (test_django_response_kinds.py) -----------------
def _hook(name: str) -> Any:
    return lambda guard, *error: counters.incr(f"hooks:{name}")


@require_token(
    "payment.create",
    subject=user,
    on_replay=_hook("replay"),
    on_conflict=_hook("conflict"),
    on_mismatch=_hook("mismatch"),
)
def hooked(request: HttpRequest) -> HttpResponseBase:
    counters.incr("runs:hooked")
    return JsonResponse({"ok": True}, status=201)
