"""Proxy detection: with ``TOKEN_SERVICE_TRUSTED_PROXY_HOPS=0`` the service believes no
``X-Forwarded-For``, so behind a proxy every client is the proxy's address, one client
to the issuance limits: one busy minute (or one attacker) refuses everyone. Requests
that carry the header say a proxy is there: the service warns once per worker, in its
log and in ``/readyz``'s body, instead of assuming.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from flask import Flask

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

log = logging.getLogger(__name__)

FORWARDED_WARNING = (
    "requests carry X-Forwarded-For but TOKEN_SERVICE_TRUSTED_PROXY_HOPS is 0: the header is "
    "ignored, so every client behind the proxy shares the proxy's address, and with it one "
    "issuance limit. Set TOKEN_SERVICE_TRUSTED_PROXY_HOPS to the number of proxies in front "
    "of the service."
)


class ForwardedForDetector:
    """Notes the first request with ``X-Forwarded-For``; what /readyz reports from then on."""

    def __init__(self) -> None:
        self.seen = False

    def note(self, environ: WSGIEnvironment) -> None:
        if not self.seen and "HTTP_X_FORWARDED_FOR" in environ:
            self.seen = True
            log.warning(FORWARDED_WARNING)

    def warnings(self) -> list[str]:
        return [FORWARDED_WARNING] if self.seen else []


class DetectingFlask(Flask):
    """The app, looking at each request before any middleware does (the hot path answers
    some without Flask), while ``app.wsgi_app`` stays what the other layers installed."""

    detector: ForwardedForDetector | None = None

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Any:
        if self.detector is not None:
            self.detector.note(environ)
        return self.wsgi_app(environ, start_response)
