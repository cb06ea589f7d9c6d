"""gunicorn's logger class for token-service (``logger_class`` in ``token_service.server.gunicorn_conf``)."""

from __future__ import annotations

import logging
from typing import Any

from gunicorn.glogging import Logger


class GunicornLogger(Logger):  # type: ignore[misc]
    """gunicorn's logger, minus the access-log work when its access logger writes nothing.

    gunicorn computes the Apache-style fields of every request whenever a
    logging configuration is given, then hands them to ``gunicorn.access``,
    which :func:`token_service.server.logs.logging_config` keeps at WARNING with no
    handler: the fields were built for nothing.
    Should that logger be enabled for INFO (another logging config), gunicorn
    logs exactly as before.
    """

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)  # applies logconfig_dict: now the access logger can be asked
        enabled: bool = self._compute_access_log_enabled() and self.access_log.isEnabledFor(logging.INFO)
        self._access_log_enabled = enabled
