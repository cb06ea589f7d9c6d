"""Renamed :mod:`token_service.client.wsgi` in 0.2.0: this alias of it goes in 0.3.0.

The WSGI ``Idempotency-Key`` middleware is named for its protocol, beside its
ASGI twin (:mod:`token_service.client.asgi`). Importing this path warns
(``DeprecationWarning``, naming the new path) and hands back the new module
itself, so every name, private ones too, is the same object under both paths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import token_service.client.wsgi as _moved
from token_service._moved import alias

if TYPE_CHECKING:
    from token_service.client.wsgi import *  # noqa: F403

alias(__name__, _moved)
