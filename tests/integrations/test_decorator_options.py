"""Each integration page documents every option of its ``@require_token``, in one table, with its default.

Before, the Flask and Django pages had no table (the Flask page never named
``wait_seconds``) and the FastAPI page's missed ``hooks``. The table's rows are
held to the decorator's signature both ways, and a default that is a number or
a string is the one the signature has.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.processes import REPO_ROOT
from token_service.client import django as django_integration
from token_service.client import fastapi as fastapi_integration
from token_service.client import flask as flask_integration
from token_service.client._require_token_core import DEFAULT_WAIT_SECONDS

PAGES: dict[str, Callable[..., Any]] = {
    "docs/integrations/flask.md": flask_integration.require_token,
    "docs/integrations/fastapi.md": fastapi_integration.require_token,
    "docs/integrations/django.md": django_integration.require_token,
}
ROW = re.compile(r"^\| `(\w+)` \| ([^|]*) \|", re.MULTILINE)


def documented(page: str) -> dict[str, str]:
    """The options table of the page (the one whose header is ``| option | default | what |``)."""
    text = (REPO_ROOT / page).read_text(encoding="utf-8")
    start = text.index("| option | default | what |")
    end = text.find("\n\n", start)
    return {name: default.strip() for name, default in ROW.findall(text[start : end if end > 0 else None])}


def options(decorator: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    return {
        name: parameter
        for name, parameter in inspect.signature(decorator).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }


@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_table_names_every_option_and_only_those(page: str) -> None:
    assert set(documented(page)) == set(options(PAGES[page])), page


@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_table_gives_the_signature_s_defaults(page: str) -> None:
    table = documented(page)
    for name, parameter in options(PAGES[page]).items():
        default = parameter.default
        if isinstance(default, bool) or not isinstance(default, int | float | str):
            continue  # None, (), a policy function: the table says it in words
        written = f"`{default:g}`" if isinstance(default, float) else f"`{default}`"
        assert table[name].startswith(written), (page, name, table[name], written)


def test_a_duplicate_waits_for_the_first_response_by_default() -> None:
    # a double click's second request arrives while the first runs (milliseconds, a payment
    # provider's second or two): by default it waits for that response instead of a 409
    for decorator in PAGES.values():
        assert options(decorator)["wait_seconds"].default == DEFAULT_WAIT_SECONDS == 2.0
