from django.urls import path

from . import views

urlpatterns = [
    path("checkout/token", views.checkout_token),
    path("payments", views.pay),
    path("payments/list", views.payments),
    path("api/orders", views.OrdersView.as_view()),
]
