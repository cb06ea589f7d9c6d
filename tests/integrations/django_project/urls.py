from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from token_service.client.django import require_token

from . import views

urlpatterns = [
    path("healthz", views.healthz),
    path("pay", csrf_exempt(views.pay)),
    path("pay-waiting", csrf_exempt(views.pay_waiting)),
    path("pay-async", csrf_exempt(views.pay_async)),
    path("declined", csrf_exempt(views.declined)),
    path("crash", csrf_exempt(views.crash)),
    path("store-down", csrf_exempt(views.store_down)),
    path("drf/payments", require_token("drf.payment")(views.PaymentView.as_view())),
    path("api/orders", csrf_exempt(views.create_order)),
    path("api/orders-async", csrf_exempt(views.create_order_async)),
    path("api/orders-503", csrf_exempt(views.unavailable_order)),
    path("api/orders-crash", csrf_exempt(views.crashing_order)),
    path("api/slow-orders", csrf_exempt(views.slow_order)),
    path("api/slow-orders-async", csrf_exempt(views.slow_order_async)),
    path("slow-reports", csrf_exempt(views.slow_report)),
    path("slow-reports-async", csrf_exempt(views.slow_report_async)),
    path("api/kinds/file", csrf_exempt(views.keyed_file)),
    path("api/kinds/stream", csrf_exempt(views.keyed_stream)),
    path("api/kinds/status", csrf_exempt(views.keyed_status)),
    path("kinds/file", csrf_exempt(views.token_file)),
    path("kinds/stream", csrf_exempt(views.token_stream)),
    path("kinds/status", csrf_exempt(views.token_status)),
    path("hooked", csrf_exempt(views.hooked)),
]
