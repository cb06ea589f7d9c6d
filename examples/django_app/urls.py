from django.urls import path

from token_service.client.django import require_token

from .views import Orders, checkout_token, pay, pay_async, payments, user

urlpatterns = [
    path("checkout/token", checkout_token),
    path("payments", pay),
    path("payments-async", pay_async),
    path("payments/list", payments),
    path("api/orders", Orders.as_view()),
    # a DRF view behind a token instead: decorate what is routed
    path("drf/payments", require_token("payment.create", subject=user)(Orders.as_view())),
]
