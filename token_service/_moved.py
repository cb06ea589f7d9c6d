"""What every alias left at a moved module's old path does on import, said once.

An alias (``token_service/admin.py``, ``client/idempotency.py``, …) imports its new
module and calls :func:`alias`: the import warns, naming the new path and the version
the old one goes in, and the old name becomes the new module itself, so every name,
private ones too, is the same object under both paths. This goes with them in 0.3.0.
"""

from __future__ import annotations

import sys
import warnings
from types import ModuleType

GOES_IN = "0.3.0"


def alias(old: str, new: ModuleType) -> None:
    """Make the module being imported as ``old`` the module ``new``, warning who imported it."""
    warnings.warn(
        f"{old} moved to {new.__name__}; the old path goes in {GOES_IN}",
        DeprecationWarning,
        # 1 is this function, 2 the alias's module body; 3 the line that imported the
        # alias (warnings skips importlib's frames), which `python -W error` must name
        stacklevel=3,
    )
    sys.modules[old] = new
