"""gunicorn's logger class for token-service (``logger_class`` in ``token_service.server.gunicorn_conf``)."""

from __future__ import annotations

import logging
from typing import Any

from gunicorn.glogging import Logger

__all__ = ["GunicornLogger"]


class GunicornLogger(Logger):  # type: ignore[misc]
    """gunicorn's logger, minus the access-log work when its access logger writes nothing.

    gunicorn computes the Apache-style fields of every request whenever a
    logging configuration is given, then hands them to ``gunicorn.access``,
    which :func:`token_service.server.logs.logging_config` keeps at WARNING with no
    handler: the fields were built for nothing.
    Should that logger be enabled for INFO (another logging config), gunicorn
    logs exactly as before.

    Only ``setup`` and ``access``, whose signatures every gunicorn release the
    ``[server]`` extra admits shares, are overridden (tests/edge/test_gunicorn_versions.py).
    """

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)  # applies logconfig_dict: now the access logger can be asked
        self._writes_access = self.access_log.isEnabledFor(logging.INFO)
        if not self._writes_access and hasattr(self, "_access_log_enabled"):
            # gunicorn >= 27 also reads this flag before it gathers what it would log
            self._access_log_enabled = False

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        if self._writes_access:
            super().access(resp, req, environ, request_time)
