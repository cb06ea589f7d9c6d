"""Files kept at the repository's top level that the package reads at run time.

``lua/``, ``openapi.yaml`` and the browser helper ``frontend/token-client.js``
stay at the top level of the repository and ship inside the wheel at the same
path under ``token_service/`` (pyproject.toml's force-include).
``shipped`` is the one place that tells an installed package from a checkout
(an editable install, the tests): an installed package carries
``openapi.yaml`` beside this module, a checkout never does.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["ROOT", "shipped"]

_PACKAGE = Path(__file__).resolve().parent
ROOT = _PACKAGE if (_PACKAGE / "openapi.yaml").is_file() else _PACKAGE.parent


def shipped(name: str) -> Path:
    """``lua``, ``openapi.yaml`` or ``frontend``: where the installed package or the checkout has it."""
    return ROOT / name
