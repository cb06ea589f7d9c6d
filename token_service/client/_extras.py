"""What a part of the SDK says when a package it needs is not installed: what to install.

The SDK's base install is ``redis`` alone; the HTTP transport and each
integration need more (pyproject.toml's extras). Without them Python would say
only ``No module named 'anyio'`` — a package the user never asked for, or
never heard of. Each of those imports is wrapped so that the error names the
part of the SDK and the ``pip install`` that brings what it needs, and stays a
``ModuleNotFoundError`` (with the missing module's ``name``) for code that
catches one.
"""

from __future__ import annotations

from typing import NoReturn

__all__ = ["DISTRIBUTION", "install", "missing"]

DISTRIBUTION = "idempotency-token-service"


def install(extra: str) -> str:
    """The command that installs one of our extras."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def missing(exc: ModuleNotFoundError, needed_by: str, packages: tuple[str, ...], how: str) -> NoReturn:
    """Raise, in place of ``exc``, the error that says ``needed_by`` needs it and ``how`` installs it.

    ``exc`` as it is when the module missing is none of ``packages`` (a module of
    one of them that is broken, say): the message must not send the user to the
    wrong install.
    """
    name = exc.name or ""
    if name.split(".", 1)[0] not in packages:
        raise exc
    raise ModuleNotFoundError(
        f"{needed_by} needs {name!r}, which is not installed: {how}", name=name
    ) from exc
