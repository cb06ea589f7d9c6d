"""The demo checkout in headless Chromium: one charge per order, and every failure said plainly.

The page comes from the shop's origin and gets its tokens from the token
service's origin (through a fault proxy, so a test can take the service down
for the page and the shop alike). Charges are counted in the shop's database.
``UPDATE_SCREENSHOTS=1`` writes each state's screenshots (desktop and phone)
into docs/img/ for docs/frontend.md.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from examples.checkout import shop as shop_module
from tests.support.browser import RunningDemo
from tests.support.processes import wait_until

pytestmark = pytest.mark.slow

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "img"
PHONE = {"width": 390, "height": 760}
# Generous: the machine may be loaded; a failing token fetch spends its retries first.
SLOW_MS = 30_000


def snap(page: Any, state: str) -> None:
    """The state's screenshots for the docs (desktop, then phone), when asked for."""
    if not os.environ.get("UPDATE_SCREENSHOTS"):
        return
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    desktop = page.viewport_size
    page.screenshot(path=str(SCREENSHOTS / f"checkout-{state}-desktop.png"), full_page=True)
    page.set_viewport_size(PHONE)
    page.screenshot(path=str(SCREENSHOTS / f"checkout-{state}-phone.png"), full_page=True)
    page.set_viewport_size(desktop)


def open_checkout(context: Any, url: str, state: str = "ready") -> Any:
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url)
    try:
        wait_state(page, state)
    except Exception:
        raise AssertionError(
            f"the page did not reach {state!r}: {status(page)} {errors} {page.locator('#log').text_content()}"
        ) from None
    return page


def wait_state(page: Any, state: str) -> None:
    page.wait_for_selector(f"#status[data-state='{state}']", timeout=SLOW_MS)


def status(page: Any) -> tuple[str, str]:
    element = page.locator("#status")
    return element.get_attribute("data-state"), element.inner_text()


def results(page: Any, count: int) -> list[tuple[str, str]]:
    """The page's result lines once ``count`` of them are settled: (outcome, text)."""
    page.wait_for_function(
        "n => document.querySelectorAll('#results li:not([data-outcome=pending])').length >= n",
        arg=count,
        timeout=SLOW_MS,
    )
    page.wait_for_timeout(300)  # a late extra line would be a bug: give it the time to show
    return [
        (item.get_attribute("data-outcome"), item.inner_text()) for item in page.locator("#results li").all()
    ]


def order_of(page: Any) -> str:
    return str(page.locator("#order").inner_text())


def charge_posts(demo: RunningDemo, order_id: str) -> list[Any]:
    return demo.shop_requests.where("POST", f"/api/orders/{order_id}/charge")


def token_posts(demo: RunningDemo) -> int:
    return len(demo.token_requests.where("POST", "/token/generate"))


def charge_ids(lines: list[tuple[str, str]]) -> set[str]:
    return {match for _, text in lines for match in re.findall(r"ch_\d+", text)}


def test_pay_charges_once_and_the_button_stays_off(context: Any, demo: RunningDemo) -> None:
    page = open_checkout(context, demo.shop_url + "/")
    order_id = order_of(page)
    assert page.url == f"{demo.shop_url}/orders/{order_id}"
    snap(page, "ready")
    # Five clicks at once: the first disables Pay, the others hit a disabled button.
    right_after = page.evaluate(
        "() => { const pay = document.getElementById('pay');"
        " for (let i = 0; i < 5; i++) pay.click();"
        " return [document.getElementById('status').dataset.state, pay.disabled,"
        " document.getElementById('new-order').disabled]; }"
    )
    assert right_after == ["paying", True, True]  # Pay, and leaving for a new order, wait for the answer
    snap(page, "paying")
    lines = results(page, 1)
    assert [outcome for outcome, _ in lines] == ["charged"], lines
    wait_state(page, "paid")
    assert page.locator("#pay").is_disabled()
    page.dblclick("#pay", force=True)  # a disabled button: nothing happens
    page.wait_for_timeout(300)
    charges = demo.charges(order_id)
    assert len(charges) == 1, charges
    assert charge_ids(lines) == {f"ch_{charges[0]['id']:04d}"}
    assert len(charge_posts(demo, order_id)) == 1
    assert token_posts(demo) == 1
    assert "cannot be charged again" in status(page)[1]
    snap(page, "paid")


def test_the_token_is_bound_to_the_order_and_the_shopper(context: Any, demo: RunningDemo) -> None:
    page = open_checkout(context, demo.shop_url + "/")
    page.click("#pay")
    results(page, 1)
    [sent] = charge_posts(demo, order_of(page))
    token = sent.headers["idempotency-token"]
    assert token
    # The token lives in the page's memory only: not in its URL, history, storage or cookies.
    assert token not in page.url
    kept = page.evaluate(
        "() => JSON.stringify([document.cookie, history.length, history.state, location.href,"
        " Object.entries(localStorage), Object.entries(sessionStorage)])"
    )
    assert token not in kept
    assert all(token not in cookie["value"] for cookie in context.cookies())
    preflights = demo.token_requests.where("OPTIONS", "/token/generate")
    assert preflights, "the browser asked for a token without a preflight"
    assert preflights[0].headers["origin"] == demo.shop_url
    # The helper is the shop's bundled copy: nothing is loaded from the token service.
    assert not demo.token_requests.where("GET", "/static/token-client.js")
    assert demo.shop_requests.where("GET", "/static/vendor/token-client.js")


def test_reload_back_and_other_tabs_never_charge_twice(context: Any, demo: RunningDemo) -> None:
    first = open_checkout(context, demo.shop_url + "/")
    order_id = order_of(first)
    stale = open_checkout(context, demo.shop_url + "/")  # a second tab, open before paying
    assert order_of(stale) == order_id
    first.click("#pay")
    assert results(first, 1)[0][0] == "charged"
    tokens_before = token_posts(demo)

    first.reload()
    wait_state(first, "paid")
    assert first.locator("#pay").is_disabled()
    first.goto(f"{demo.shop_url}/api/orders/{order_id}")
    first.go_back()
    wait_state(first, "paid")
    assert first.locator("#pay").is_disabled()
    fresh = open_checkout(context, demo.shop_url + "/", state="paid")  # a new tab: the same order, paid
    assert order_of(fresh) == order_id
    assert token_posts(demo) == tokens_before, "a paid order needs no token"

    # The tab opened before paying still offers Pay, with its own token: the order answers.
    stale.click("#pay")
    lines = results(stale, 1)
    assert [outcome for outcome, _ in lines] == ["already-paid"], lines
    assert "You were not charged again" in lines[0][1]
    wait_state(stale, "paid")
    snap(stale, "already-paid")
    charges = demo.charges(order_id)
    assert len(charges) == 1, charges
    tokens = {seen.headers["idempotency-token"] for seen in charge_posts(demo, order_id)}
    assert len(tokens) == 2  # two tokens for one order, one charge


def test_two_tabs_paying_the_same_order_at_once_charge_once(context: Any, demo: RunningDemo) -> None:
    first = open_checkout(context, demo.shop_url + "/")
    second = open_checkout(context, demo.shop_url + "/")
    first.evaluate("() => document.getElementById('pay').click()")
    second.evaluate("() => document.getElementById('pay').click()")
    outcomes = sorted([results(first, 1)[0][0], results(second, 1)[0][0]])
    assert outcomes == ["already-paid", "charged"], outcomes
    assert len(demo.charges(order_of(first))) == 1


def test_closing_the_tab_mid_payment_and_coming_back_charges_once(
    context: Any, demo_factory: Callable[..., RunningDemo]
) -> None:
    demo = demo_factory(charge_delay_seconds=1.5)  # the payment provider still at work when the tab closes
    page = open_checkout(context, demo.shop_url + "/")
    order_id = order_of(page)
    page.click("#pay")
    wait_until(lambda: charge_posts(demo, order_id), what="the charge to reach the shop")
    page.close()  # the shopper gives up waiting; the shop carries on
    back = context.new_page()
    back.goto(f"{demo.shop_url}/orders/{order_id}")
    back.wait_for_selector("#status[data-state='ready'], #status[data-state='paid']", timeout=SLOW_MS)
    if status(back)[0] == "ready":  # the first charge had not committed yet: paying again is safe
        back.click("#pay")
        assert [outcome for outcome, _ in results(back, 1)] == ["already-paid"]
    wait_state(back, "paid")
    assert back.locator("#pay").is_disabled()
    assert len(demo.charges(order_id)) == 1
    back.reload()
    wait_state(back, "paid")
    assert len(demo.charges(order_id)) == 1


def test_a_lost_reply_is_retried_with_the_same_token(context: Any, demo: RunningDemo) -> None:
    page = open_checkout(context, demo.shop_url + "/")
    attempts = {"count": 0}

    def lose_the_first_reply(route: Any) -> None:
        attempts["count"] += 1
        if attempts["count"] == 1:
            route.fetch()  # the shop gets the request and charges...
            route.abort("connectionreset")  # ...but its reply never reaches the page
        else:
            route.continue_()

    page.route("**/api/orders/*/charge", lose_the_first_reply)
    page.click("#pay")
    lines = results(page, 1)
    assert [outcome for outcome, _ in lines] == ["recovered"], lines
    wait_state(page, "paid")
    assert "sending the payment again with the same token" in page.locator("#log").text_content()
    snap(page, "recovered")
    order_id = order_of(page)
    assert len(demo.charges(order_id)) == 1
    assert len({seen.headers["idempotency-token"] for seen in charge_posts(demo, order_id)}) == 1


def test_no_answer_from_the_shop_is_said_honestly_and_paying_again_is_safe(
    context: Any, demo: RunningDemo
) -> None:
    page = open_checkout(context, demo.shop_url + "/")
    page.route("**/api/orders/*/charge", lambda route: route.abort("connectionrefused"))
    page.click("#pay")
    lines = results(page, 1)
    assert lines == [("unconfirmed", "We couldn't confirm this payment.")]
    _, text = status(page)
    assert "Paying again is safe: this order can only be charged once." in text
    assert page.locator("#pay").is_enabled()
    assert page.locator("#retry").inner_text() == "Check again"
    snap(page, "unconfirmed")
    page.unroute("**/api/orders/*/charge")
    page.click("#pay")
    assert [outcome for outcome, _ in results(page, 2)] == ["unconfirmed", "charged"]
    assert len(demo.charges(order_of(page))) == 1


def test_a_new_order_is_an_explicit_action(context: Any, demo: RunningDemo) -> None:
    page = open_checkout(context, demo.shop_url + "/")
    first_order = order_of(page)
    page.click("#pay")
    wait_state(page, "paid")
    page.click("#new-order")
    page.wait_for_url(re.compile(r"/orders/(?!" + first_order + ")"), timeout=SLOW_MS)
    wait_state(page, "ready")
    second_order = order_of(page)
    page.click("#pay")
    assert [outcome for outcome, _ in results(page, 1)] == ["charged"]
    assert len(demo.charges(first_order)) == len(demo.charges(second_order)) == 1
    first_tokens = {seen.headers["idempotency-token"] for seen in charge_posts(demo, first_order)}
    second_tokens = {seen.headers["idempotency-token"] for seen in charge_posts(demo, second_order)}
    assert not first_tokens & second_tokens
    page.go_back()  # the first order again: still paid
    wait_state(page, "paid")
    assert order_of(page) == first_order


def test_token_service_unreachable_at_load_and_at_click(context: Any, demo: RunningDemo) -> None:
    demo.token_service_down()
    page = open_checkout(context, demo.shop_url + "/", state="unavailable")
    _, text = status(page)
    assert "can't reach the payment service" in text
    assert "not been charged" in text
    assert page.locator("#retry").is_visible()
    assert page.locator("#retry").inner_text() == "Try again"
    assert page.locator("#pay").is_enabled()  # the page stays usable
    assert page.locator("#new-order").is_enabled()
    assert page.locator("#item-name").is_visible()
    log = page.locator("#log").text_content()
    assert "asking for a payment token again" in log
    assert "same token" not in log  # there is no token yet
    snap(page, "unavailable")

    page.click("#pay")  # still down: the click needs a token and cannot get one
    lines = results(page, 1)
    assert lines == [("unavailable", "We couldn't reach the payment service. You were not charged.")]
    wait_state(page, "unavailable")
    order_id = order_of(page)
    assert charge_posts(demo, order_id) == []

    demo.token_service_up()
    page.click("#retry")
    wait_state(page, "ready")
    assert not page.locator("#retry").is_visible()
    page.click("#pay")
    lines = results(page, 2)
    assert [outcome for outcome, _ in lines] == ["unavailable", "charged"], lines  # in click order
    assert len(demo.charges(order_id)) == 1


def test_a_shop_missing_from_the_cors_list_gets_the_same_usable_page(
    context: Any, demo_factory: Callable[..., RunningDemo]
) -> None:
    # The browser tells the page nothing more than "no answer": the page says what it can, and
    # `python -m examples.checkout --token-service URL` warns the developer at start.
    demo = demo_factory(shop_origin_listed=False)
    page = open_checkout(context, demo.shop_url + "/", state="unavailable")
    assert "can't reach the payment service" in status(page)[1]
    assert page.locator("#retry").is_visible()
    assert demo.token_requests.where("OPTIONS", "/token/generate")  # refused by the preflight
    assert demo.charges() == []


def test_token_service_dies_between_token_and_charge(context: Any, demo: RunningDemo) -> None:
    page = open_checkout(context, demo.shop_url + "/")  # the token is in hand
    order_id = order_of(page)
    demo.token_service_down()
    page.click("#pay")
    lines = results(page, 1)
    assert lines == [("not-charged", "The payment didn't go through. You were not charged.")]
    state, text = status(page)
    assert state == "not-charged"
    assert "you were not charged" in text
    assert page.locator("#pay").is_enabled()
    snap(page, "not-charged")
    assert charge_posts(demo, order_id), "the charge reached the shop"
    assert demo.charges(order_id) == []  # the shop could not check the token: it charged nothing

    demo.token_service_up()
    page.click("#pay")
    lines = results(page, 2)
    assert [outcome for outcome, _ in lines] == ["not-charged", "charged"], lines
    assert len(demo.charges(order_id)) == 1


def test_rate_limited(context: Any, demo_factory: Callable[..., RunningDemo]) -> None:
    demo = demo_factory(token_settings={"rate_limit": "1/minute"})
    first = open_checkout(context, demo.shop_url + "/")  # spends the one token a minute
    second = open_checkout(context, demo.shop_url + "/", state="rate-limited")
    _, text = status(second)
    assert "Too many payment attempts" in text
    assert "not been charged" in text
    assert re.search(r"wait \d+ s", text), text
    assert second.locator("#pay").is_disabled()
    snap(second, "rate-limited")
    first.click("#pay")  # the first tab holds its token: it pays
    assert [outcome for outcome, _ in results(first, 1)] == ["charged"]
    assert len(demo.charges(order_of(first))) == 1


def test_a_token_that_expired_while_the_page_sat_open_is_replaced(
    context: Any, demo_factory: Callable[..., RunningDemo]
) -> None:
    demo = demo_factory(token_ttl_seconds=2)
    page = open_checkout(context, demo.shop_url + "/")
    assert token_posts(demo) == 1
    page.wait_for_timeout(2_500)  # the page sits open past the token's lifetime
    page.click("#pay")
    lines = results(page, 1)
    assert [outcome for outcome, _ in lines] == ["charged"], lines
    assert token_posts(demo) == 2
    assert "expired unused; got a fresh one" in page.locator("#log").text_content()
    order_id = order_of(page)
    assert len(charge_posts(demo, order_id)) == 1  # the stale token was never sent
    assert len(demo.charges(order_id)) == 1


def test_a_token_that_expired_after_an_unanswered_attempt_is_replaced_for_the_order(
    context: Any, demo_factory: Callable[..., RunningDemo]
) -> None:
    # The helper never replaces a token a request carried (its work may be done); the order can be
    # charged only once whatever the token, so the page may take a fresh one for it.
    demo = demo_factory(token_ttl_seconds=2)
    page = open_checkout(context, demo.shop_url + "/")
    page.route("**/api/orders/*/charge", lambda route: route.abort("connectionrefused"))
    page.click("#pay")
    assert [outcome for outcome, _ in results(page, 1)] == ["unconfirmed"]
    page.unroute("**/api/orders/*/charge")
    page.wait_for_timeout(2_500)  # the shopper comes back after the token's lifetime
    page.click("#pay")
    lines = results(page, 2)
    assert [outcome for outcome, _ in lines] == ["unconfirmed", "charged"], (
        lines,
        page.locator("#log").text_content(),
    )
    wait_state(page, "paid")
    assert (
        "the payment token had expired; got a fresh one for this order" in page.locator("#log").text_content()
    )
    order_id = order_of(page)
    assert len(demo.charges(order_id)) == 1
    assert token_posts(demo) == 2
    assert len({seen.headers["idempotency-token"] for seen in charge_posts(demo, order_id)}) == 2


def test_after_a_charge_that_failed_in_the_shop_paying_again_works(
    context: Any, demo: RunningDemo, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The payment provider fails once: the charge rolls back, the shop answers 500 (its guard
    # releases the token), the page finds the order unpaid and says so; the next Pay charges it.
    failures = {"left": 1}

    class FlakyProvider:
        @staticmethod
        def sleep(seconds: float) -> None:
            if failures["left"]:
                failures["left"] -= 1
                raise ConnectionError("the payment provider hung up")
            time.sleep(seconds)

    monkeypatch.setattr(shop_module, "time", FlakyProvider)
    page = open_checkout(context, demo.shop_url + "/")
    page.click("#pay")
    assert results(page, 1) == [("not-charged", "The payment didn't go through. You were not charged.")]
    assert page.locator("#pay").is_enabled()
    order_id = order_of(page)
    assert demo.charges(order_id) == []
    page.click("#pay")
    lines = results(page, 2)
    assert [outcome for outcome, _ in lines] == ["not-charged", "charged"], (
        lines,
        page.locator("#log").text_content(),
    )
    assert len(demo.charges(order_id)) == 1


def test_a_token_that_failed_for_good_is_replaced_for_the_order(context: Any, demo: RunningDemo) -> None:
    # A terminal failure stays with its token: every later request carrying it is refused with
    # 409 token_failed. The order is unpaid, so the page pays it with a fresh token, not that one.
    page = open_checkout(context, demo.shop_url + "/")
    failed: dict[str, str] = {}

    def the_shop_recorded_a_terminal_failure(route: Any) -> None:
        token = route.request.headers["idempotency-token"]
        failed.setdefault("token", token)
        if token != failed["token"]:
            return route.continue_()
        route.fulfill(
            status=409,
            headers={"Content-Type": "application/problem+json"},
            body='{"code": "token_failed", "status": 409, "error": {"type": "Declined"}}',
        )

    page.route("**/api/orders/*/charge", the_shop_recorded_a_terminal_failure)
    page.click("#pay")
    assert results(page, 1) == [("not-charged", "The payment didn't go through. You were not charged.")]
    page.click("#pay")
    lines = results(page, 2)
    assert [outcome for outcome, _ in lines] == ["not-charged", "charged"], (
        lines,
        page.locator("#log").text_content(),
    )
    order_id = order_of(page)
    assert len(demo.charges(order_id)) == 1
    assert token_posts(demo) == 2


def test_after_the_wait_the_page_tries_again_by_itself(context: Any, demo: RunningDemo) -> None:
    page = context.new_page()
    refused = {"count": 0}

    def limit_once(route: Any) -> None:
        if route.request.method == "POST" and refused["count"] == 0:
            refused["count"] += 1
            route.fulfill(
                status=429,
                headers={"Content-Type": "application/problem+json"},
                body='{"code": "rate_limited", "status": 429, "retry_after_seconds": 2}',
            )
        else:
            route.continue_()

    page.route("**/token/generate", limit_once)
    page.goto(demo.shop_url + "/")
    wait_state(page, "rate-limited")
    wait_state(page, "ready")  # the countdown ran out and the page asked again
    page.click("#pay")
    assert [outcome for outcome, _ in results(page, 1)] == ["charged"]
    assert len(demo.charges(order_of(page))) == 1


def test_docs_show_each_state_on_desktop_and_phone() -> None:
    """Every state this file screenshots has both pictures in docs/img/, shown by docs/frontend.md."""
    states = re.findall(r'snap\(\w+, "([\w-]+)"\)', Path(__file__).read_text())
    assert len(states) >= 9
    page = (SCREENSHOTS.parent / "frontend.md").read_text()
    for state in states:
        for device in ("desktop", "phone"):
            name = f"checkout-{state}-{device}.png"
            assert (SCREENSHOTS / name).is_file(), name
            assert f"(img/{name})" in page, name
