"""Moved to :mod:`token_service.server.gunicorn_conf` in 0.2.0: this alias of it goes in 0.3.0.

gunicorn reads it with ``-c python:token_service.gunicorn_conf``: use
``-c python:token_service.server.gunicorn_conf``. Python hides a DeprecationWarning
outside ``__main__``, so gunicorn does not print this one (CHANGELOG.md says so).

Importing it warns (``DeprecationWarning``, naming the new path) and hands back the new
module itself, so every name, private ones too, is the same object under both paths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import token_service.server.gunicorn_conf as _moved
from token_service._moved import alias

if TYPE_CHECKING:
    from token_service.server.gunicorn_conf import *  # noqa: F403

alias(__name__, _moved)
