"""What the examples' ``__main__`` share: their own default port, and a busy port named."""

from __future__ import annotations

import os

from token_service.server.cli import busy_port_message, port_in_use


def port_or_exit(default: int, make_target: str) -> int:
    """``PORT`` or the example's own default; exits naming the setting when the port is taken.

    Each example has its own default (the service keeps 8000, the docs site 8001), so an
    example started next to ``make run`` neither fails nor answers the service's curl lines.
    """
    port = int(os.environ.get("PORT", str(default)))
    if port_in_use("127.0.0.1", port):
        raise SystemExit(busy_port_message("127.0.0.1", port, f"PORT={{port}} make {make_target}"))
    return port
