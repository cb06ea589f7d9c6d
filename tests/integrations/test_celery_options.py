"""IdempotentTask reads its options when it runs (docs/testing-your-code.md: a test sets
``token_client`` with ``monkeypatch`` and calls ``apply()``): in process, no broker.

What a task's guards are made of is kept between calls (1cd497a), but only for as long as the
options it was made from are the task's: a test that sets another ``token_client`` (each test its
own client) or another option gets guards made of what it set, not of the first test's.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from token_service.client.celery import IdempotentTask
from token_service.testing import InMemoryStore

app = Celery("review_options")
ran: list[str] = []


@app.task(base=IdempotentTask, idempotency_key="order_id", name="review.ship")
def ship(order_id: str) -> str:
    ran.append(order_id)
    return f"parcel {len(ran)}"


def test_a_token_client_set_after_a_first_call_is_the_one_the_next_call_uses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran.clear()
    first, second = InMemoryStore(), InMemoryStore()
    with first.client() as one, second.client() as other:
        monkeypatch.setattr(ship, "token_client", one)
        assert ship.apply(kwargs={"order_id": "o-1"}).get() == "parcel 1"
        monkeypatch.setattr(ship, "token_client", other)  # the next test's own store: nothing ran there
        assert ship.apply(kwargs={"order_id": "o-1"}).get() == "parcel 2"
        assert ship.apply(kwargs={"order_id": "o-1"}).get() == "parcel 2"  # replayed from it
    assert ran == ["o-1", "o-1"]


def test_an_option_set_after_a_first_call_is_the_one_the_next_call_uses(
    monkeypatch: pytest.MonkeyPatch, token_client: Any
) -> None:
    ran.clear()
    monkeypatch.setattr(ship, "token_client", token_client)
    assert ship.apply(kwargs={"order_id": "o-2"}).get() == "parcel 1"
    monkeypatch.setattr(ship, "idempotency_scope", "review.ship.v2")  # another scope: another key
    assert ship.apply(kwargs={"order_id": "o-2"}).get() == "parcel 2"
    assert ran == ["o-2", "o-2"]


@app.task(base=IdempotentTask, idempotency_key=lambda order_id, amount: order_id, name="review.charge")
def charge(order_id: str, amount: int) -> str:
    ran.append(order_id)
    return f"charged {amount} for {order_id}"


def test_a_callable_key_given_to_the_task_decorator_is_given_the_tasks_arguments(
    monkeypatch: pytest.MonkeyPatch, token_client: Any
) -> None:
    # docs/integrations/celery.md: "a callable given the task's arguments"; a function set as a
    # task attribute is bound to the task when read, and must not be handed the task as well
    ran.clear()
    monkeypatch.setattr(charge, "token_client", token_client)
    assert charge.apply(kwargs={"order_id": "o-3", "amount": 5}).get() == "charged 5 for o-3"
    assert charge.apply(kwargs={"order_id": "o-3", "amount": 5}).get() == "charged 5 for o-3"
    assert ran == ["o-3"]
