"""Proxy detection: with ``TOKEN_SERVICE_TRUSTED_PROXY_HOPS=0`` the service believes no
``X-Forwarded-For``, so behind a proxy every client is the proxy's address, one client
to the issuance limits: one busy minute (or one attacker) refuses everyone. Requests
that carry the header say a proxy is there: the service warns, in its log (once) and in
``/readyz``'s body from then on, instead of assuming.

"From then on" holds for the whole instance: under gunicorn the worker that sees the
first such request creates a flag file in the directory the workers already share for
their metrics (``PROMETHEUS_MULTIPROC_DIR``, emptied at each start), and every worker's
``/readyz`` looks for it, so all of them answer alike (a worker-local flag gave 13
answers of 20 with the warning and 7 without).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flask import Flask

from token_service.server.metric_files import FORWARDED_FLAG_FILE

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

__all__ = ["FORWARDED_WARNING", "DetectingFlask", "ForwardedForDetector"]

log = logging.getLogger(__name__)

FORWARDED_WARNING = (
    "requests carry X-Forwarded-For but TOKEN_SERVICE_TRUSTED_PROXY_HOPS is 0: the header is "
    "ignored, so every client behind the proxy shares the proxy's address, and with it one "
    "issuance limit. Set TOKEN_SERVICE_TRUSTED_PROXY_HOPS to the number of proxies in front "
    "of the service."
)


class ForwardedForDetector:
    """Notes the first request with ``X-Forwarded-For``; what /readyz reports from then on.

    ``shared``: the directory the instance's workers share (None: this process only).
    """

    def __init__(self, shared: Path | None = None) -> None:
        self.seen = False
        self._flag = shared / FORWARDED_FLAG_FILE if shared is not None else None

    def note(self, environ: WSGIEnvironment) -> None:
        if not self.seen and "HTTP_X_FORWARDED_FOR" in environ:
            self.seen = True
            if self._first_to_tell():
                log.warning(FORWARDED_WARNING)

    def _first_to_tell(self) -> bool:
        """Tell the other workers; True for the one worker that told them first (it logs)."""
        if self._flag is None:
            return True
        try:
            os.close(os.open(self._flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            return False
        except OSError as exc:  # the directory went away: this worker still warns
            log.error("could not share the X-Forwarded-For warning with the other workers: %s", exc)
        return True

    def warnings(self) -> list[str]:
        if not self.seen and self._flag is not None and self._flag.exists():
            self.seen = True  # another worker saw it: one stat per /readyz until then
        return [FORWARDED_WARNING] if self.seen else []


class DetectingFlask(Flask):
    """The app, looking at each request before any middleware does (the hot path answers
    some without Flask), while ``app.wsgi_app`` stays what the other layers installed."""

    detector: ForwardedForDetector | None = None

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Any:
        if self.detector is not None:
            self.detector.note(environ)
        return self.wsgi_app(environ, start_response)
