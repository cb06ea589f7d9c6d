"""examples/payment_api driven end to end: a double-clicked Pay charges once, on every transport."""

from __future__ import annotations

import threading
from typing import Any

from examples.payment_api import Bank, create_app
from tests.support.sdk import Sdk


def pay(app: Any, token: str, user: str = "alice", amount: int = 1250) -> Any:
    return app.test_client().post(
        "/payments",
        json={"amount": amount, "currency": "EUR"},
        headers={"X-User-Id": user, "Idempotency-Token": token},
    )


def checkout_token(app: Any, user: str = "alice") -> str:
    response = app.test_client().post("/checkout/token", headers={"X-User-Id": user})
    assert response.status_code == 201
    assert response.headers["Cache-Control"] == "no-store"
    token: str = response.get_json()["token"]
    return token


def test_a_double_clicked_pay_charges_once(sdk: Sdk) -> None:
    bank = Bank()
    app = create_app(sdk.client, bank)
    token = checkout_token(app)
    first = pay(app, token)
    assert first.status_code == 201
    payment = first.get_json()
    assert payment["amount"] == 1250
    second = pay(app, token)
    assert second.status_code == 201
    assert second.get_json() == payment
    assert second.headers["Idempotent-Replayed"] == "true"
    assert second.headers["Location"] == f"/payments/{payment['id']}"
    assert len(bank.charges) == 1
    shown = app.test_client().get(second.headers["Location"], headers={"X-User-Id": "alice"})
    assert shown.get_json() == payment


def test_simultaneous_clicks_charge_once(sdk: Sdk) -> None:
    bank = Bank()
    app = create_app(sdk.client, bank)
    token = checkout_token(app)
    barrier = threading.Barrier(6)
    answers: list[Any] = []

    def click() -> None:
        barrier.wait()
        answers.append(pay(app, token))

    threads = [threading.Thread(target=click) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(bank.charges) == 1
    statuses = sorted(answer.status_code for answer in answers)
    # the winner 201; the rest either saw it in flight (409) or replayed its 201
    assert statuses.count(201) >= 1
    assert set(statuses) <= {201, 409}
    for answer in answers:
        if answer.status_code == 409:
            assert answer.get_json()["code"] == "token_in_progress"
            assert "Retry-After" in answer.headers


def test_a_declined_card_is_answered_the_same_way_twice(sdk: Sdk) -> None:
    bank = Bank(limit=1000)
    app = create_app(sdk.client, bank)
    token = checkout_token(app)
    declined = pay(app, token, amount=5000)
    assert declined.status_code == 402
    again = pay(app, token, amount=5000)
    assert again.status_code == 402
    assert again.headers["Idempotent-Replayed"] == "true"
    assert bank.charges == {}


def test_tokens_are_bound_to_their_user(sdk: Sdk) -> None:
    bank = Bank()
    app = create_app(sdk.client, bank)
    token = checkout_token(app, user="alice")
    stolen = pay(app, token, user="mallory")
    assert stolen.status_code == 403
    assert stolen.get_json()["code"] == "token_mismatch"
    assert pay(app, "made-up-token-0123456789").status_code == 404
    no_token = app.test_client().post("/payments", json={"amount": 1}, headers={"X-User-Id": "alice"})
    assert no_token.status_code == 400
    no_user = app.test_client().post("/payments", json={"amount": 1}, headers={"Idempotency-Token": token})
    assert no_user.status_code == 401
    assert bank.charges == {}
    assert pay(app, token).status_code == 201  # the rightful owner still can
