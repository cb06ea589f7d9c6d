"""The demo checkout in headless Chromium: whatever the user does, one charge per order.

The page comes from the shop's origin and gets its tokens from the token
service's origin, so each test also runs the real CORS exchange (preflight
included) that a production page would.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.frontend.conftest import RunningDemo

pytestmark = pytest.mark.slow

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "checkout-double-click.png"


def open_checkout(context: Any, demo: RunningDemo) -> Any:
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(demo.shop_url + "/")
    try:
        page.wait_for_selector("#status[data-state=ready]")
    except Exception:
        raise AssertionError(f"the checkout page did not start: {errors}") from None
    return page


def results(page: Any, count: int) -> list[tuple[str, str]]:
    """The page's result lines once there are ``count`` of them: (outcome, text)."""
    page.wait_for_function("n => document.querySelectorAll('#results li').length >= n", arg=count)
    page.wait_for_timeout(300)  # a late extra line would be a bug: give it the time to show
    items = page.locator("#results li")
    return [(item.get_attribute("data-outcome"), item.inner_text()) for item in items.all()]


def charge_ids(lines: list[tuple[str, str]]) -> set[str]:
    return {match for _, text in lines for match in re.findall(r"ch_\d+", text)}


def tokens_sent(demo: RunningDemo) -> list[str]:
    return [
        seen.headers.get("idempotency-token", "") for seen in demo.shop_requests.where("POST", "/api/charges")
    ]


def test_double_click_charges_once_and_shows_the_replayed_result(context: Any, demo: RunningDemo) -> None:
    page = open_checkout(context, demo)
    page.dblclick("#pay")

    lines = results(page, 2)
    assert sorted(outcome for outcome, _ in lines) == ["charged", "duplicate"], lines
    assert "nothing was charged again" in dict(lines)["duplicate"]
    charges = demo.charges()
    assert len(charges) == 1, charges
    assert charge_ids(lines) == {charges[0]["id"]}
    assert page.locator("#status").get_attribute("data-state") == "paid"
    # Both clicks were one action: one token issued, sent by both requests.
    assert len(demo.token_requests.where("POST", "/token/generate")) == 1
    sent = tokens_sent(demo)
    assert len(sent) >= 2
    assert len(set(sent)) == 1
    assert sent[0]

    if os.environ.get("UPDATE_SCREENSHOTS"):
        SCREENSHOT.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), full_page=True)


def test_the_browser_does_a_cors_preflight_for_the_token(context: Any, demo: RunningDemo) -> None:
    page = open_checkout(context, demo)
    page.click("#pay")
    results(page, 1)

    preflights = demo.token_requests.where("OPTIONS", "/token/generate")
    assert preflights, "the browser asked for a token without a preflight"
    assert preflights[0].headers["origin"] == demo.shop_url
    assert preflights[0].headers["access-control-request-method"] == "POST"
    module = demo.token_requests.where("GET", "/static/token-client.js")
    assert module
    assert module[0].headers["origin"] == demo.shop_url  # a module script is fetched with CORS


def test_a_lost_reply_is_retried_with_the_same_token_and_charges_once(
    context: Any, demo: RunningDemo
) -> None:
    page = open_checkout(context, demo)
    attempts = {"count": 0}

    def lose_the_first_reply(route: Any) -> None:
        attempts["count"] += 1
        if attempts["count"] == 1:
            route.fetch()  # the shop gets the request and charges...
            route.abort("connectionreset")  # ...but its reply never reaches the page
        else:
            route.continue_()

    page.route("**/api/charges", lose_the_first_reply)
    page.click("#pay")
    lines = results(page, 1)
    assert [outcome for outcome, _ in lines] == ["recovered"], lines
    assert "retry 1 after network" in page.locator("#log").inner_text()
    assert len(demo.charges()) == 1

    page.click("#pay")  # the user clicks again: still the same order
    lines = results(page, 2)
    assert [outcome for outcome, _ in lines] == ["recovered", "duplicate"], lines
    charges = demo.charges()
    assert len(charges) == 1, charges
    assert charge_ids(lines) == {charges[0]["id"]}
    sent = tokens_sent(demo)
    assert len(sent) == 3  # the lost attempt, its retry, the second click
    assert len(set(sent)) == 1

    # A new order is a new action: a fresh token and exactly one more charge.
    page.click("#new-order")
    page.click("#pay")
    lines = results(page, 1)
    assert [outcome for outcome, _ in lines] == ["charged"], lines
    charges = demo.charges()
    assert len(charges) == 2
    assert charge_ids(lines) == {charges[1]["id"]}
    sent = tokens_sent(demo)
    assert len(set(sent)) == 2
    assert sent[-1] != sent[0]


def test_two_tabs_are_two_actions_each_charged_once(context: Any, demo: RunningDemo) -> None:
    first = open_checkout(context, demo)
    second = open_checkout(context, demo)
    first.dblclick("#pay")
    second.dblclick("#pay")

    first_lines = results(first, 2)
    second_lines = results(second, 2)
    for lines in (first_lines, second_lines):
        assert sorted(outcome for outcome, _ in lines) == ["charged", "duplicate"], lines
    charges = demo.charges()
    assert len(charges) == 2, charges
    assert charge_ids(first_lines) | charge_ids(second_lines) == {charge["id"] for charge in charges}
    assert charge_ids(first_lines) != charge_ids(second_lines)
    assert len(set(tokens_sent(demo))) == 2
