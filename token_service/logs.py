"""Logging configuration: one JSON object per line on stderr.

``token_service.gunicorn_conf`` hands :func:`logging_config` to gunicorn
(``logconfig_dict``), so gunicorn's own messages, the app's and the access
lines (``token_service.access``, written by :mod:`token_service.telemetry`;
gunicorn's access log is off) all come out as JSON with a ``request_id``
where there is one. The service never logs a token or a request body.
"""

from __future__ import annotations

import logging
from typing import Any

JSON_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` to every record written while a request runs."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            # imported here: gunicorn's master configures logging without loading Flask
            from flask import g, has_request_context

            record.request_id = g.get("request_id") if has_request_context() else None
        return True


def logging_config(level: str = "INFO") -> dict[str, Any]:
    handler = {
        "class": "logging.StreamHandler",
        "formatter": "json",
        "filters": ["request_id"],
        "stream": "ext://sys.stderr",
    }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": "token_service.logs.RequestIdFilter"}},
        "formatters": {
            "json": {
                "()": "pythonjsonlogger.json.JsonFormatter",
                "fmt": JSON_FORMAT,
                "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
            }
        },
        "handlers": {"json": handler},
        "root": {"level": level, "handlers": ["json"]},
        "loggers": {
            # gunicorn's own loggers: same handler, no second copy through the root
            "gunicorn.error": {"level": level, "handlers": ["json"], "propagate": False},
            "gunicorn.access": {"level": "WARNING", "handlers": [], "propagate": False},
        },
    }
