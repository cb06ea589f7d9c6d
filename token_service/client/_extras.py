"""What a part of the SDK says when a package it needs is not installed: what to install.

The base install is ``redis`` alone; without an extra Python would only say ``No module named
'anyio'``, a package the user never asked for. The error names the part of the SDK and the
``pip install`` that brings it, and stays a ``ModuleNotFoundError`` (with the module's ``name``).
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
