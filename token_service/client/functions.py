"""Renamed :mod:`token_service.client.keyed` in 0.2.0: this alias of it goes in 0.3.0.

``@idempotent`` and ``keyed_guard`` are idempotency keyed by a value of the
call (no token issued beforehand), and their module is named for that.
Importing this path warns (``DeprecationWarning``, naming the new path) and
hands back the new module itself, so every name, private ones too, is the same
object under both paths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import token_service.client.keyed as _moved
from token_service._moved import alias

if TYPE_CHECKING:
    from token_service.client.keyed import *  # noqa: F403

alias(__name__, _moved)
