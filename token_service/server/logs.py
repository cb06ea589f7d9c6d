"""Logging configuration: one JSON object per line on stderr (``console``: plain lines for development).

``token_service.server.gunicorn_conf`` hands :func:`logging_config` to gunicorn
(``logconfig_dict``), so gunicorn's own messages, the app's and the access
lines (``token_service.access``, written by :mod:`token_service.server.telemetry`;
gunicorn's access log is off) all come out as JSON with a ``request_id``
where there is one. The service never logs a token or a request body.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Mapping
from typing import Any

from pythonjsonlogger.json import JsonEncoder
from pythonjsonlogger.json import JsonFormatter as _LibraryJsonFormatter

from token_service.server import json_text, request_context

__all__ = [
    "JSON_FORMAT",
    "ConsoleFormatter",
    "DirectLines",
    "JsonFormatter",
    "RequestIdFilter",
    "console_value",
    "logging_config",
]

JSON_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# Sets of record attributes (a record's extra fields) a JSON formatter remembers the names of:
# the access line's few, the app's own log calls; beyond that, worked out line by line.
_MAX_SHAPES = 64
# The record fields a line written without a record (JsonFormatter.direct_line) can fill in.
_DIRECT_FIELDS = frozenset({"asctime", "levelname", "name", "message"})


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` to every record written while a request runs."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_context.request_id()
        return True


class JsonFormatter(_LibraryJsonFormatter):
    """python-json-logger's JSON lines, character for character, built faster for plain records.

    Every request writes an access line, and the library's general path (a
    fresh encoder per line, renames looked up field by field, the time
    formatted anew) cost about half of what a line took. Records with
    an exception, a stack, a dict message, or a value plain ``json.dumps``
    cannot write take the library's path unchanged, as does any configuration
    of the formatter this path does not reproduce (a test compares the two).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._required = [(field, self.rename_fields.get(field, field)) for field in self._required_fields]
        self._wants_asctime = "asctime" in self._required_fields
        self._fast = (
            not self.defaults
            and not self.static_fields
            and not self.timestamp
            and not self.rename_fields_keep_missing
            and self.json_indent is None
            and self.json_ensure_ascii
            and self.prefix == ""
            and self.json_serializer is json.dumps
            and self.json_encoder is JsonEncoder
            and type(self).process_log_record is _LibraryJsonFormatter.process_log_record
        )
        self._time_cache = (-1, "")
        self._extras: dict[tuple[str, ...], list[tuple[str, str]]] = {}
        # whether direct_line writes this formatter's line for a record it never sees
        self.direct = (
            self._fast
            and not self.datefmt
            and bool(self.default_msec_format)
            and _DIRECT_FIELDS.issuperset(self._required_fields)
            and type(self).format is JsonFormatter.format
            and type(self).formatTime is JsonFormatter.formatTime
        )

    def _extras_of(self, shape: tuple[str, ...]) -> list[tuple[str, str]]:
        """The record attributes a line writes after the required fields, each with its name."""
        skip, rename = self._skip_fields, self.rename_fields
        extras = [
            (key, rename.get(key, key))
            for key in shape
            if key not in skip and not (isinstance(key, str) and key.startswith("_"))
        ]
        if len(self._extras) < _MAX_SHAPES:
            self._extras[shape] = extras
        return extras

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt or not self.default_msec_format:
            return super().formatTime(record, datefmt)
        return self._time_text(record.created, record.msecs)

    def _time_text(self, created: float, msecs: float) -> str:
        # logging's text, with the strftime done once per second (one tuple: thread-safe)
        second = int(created)
        cached = self._time_cache
        if cached[0] != second:
            cached = (second, time.strftime(self.default_time_format, self.converter(created)))
            self._time_cache = cached
        # its callers have checked that there is a default_msec_format
        return self.default_msec_format % (cached[1], msecs)  # type: ignore[operator]

    def direct_line(
        self, created: float, msecs: float, level: int, name: str, message: str, fields: Mapping[str, Any]
    ) -> str | None:
        """The line :meth:`format` writes for a plain record of ``name`` made at ``created`` (and
        ``msecs``) with ``message`` and the extra ``fields`` (none of them a LogRecord attribute),
        without the record; None when only the library's encoder can write a value (or
        :attr:`direct` is false)."""
        if not self.direct:
            return None
        known = {"levelname": logging.getLevelName(level), "name": name, "message": message}
        if self._wants_asctime:
            known["asctime"] = self._time_text(created, msecs)
        data = {out: known.get(field) for field, out in self._required}
        rename = self.rename_fields
        for key, value in fields.items():
            data[rename.get(key, key)] = value
        try:
            return json_text.spaced(data)
        except (TypeError, ValueError, RecursionError):
            return None

    def format(self, record: logging.LogRecord) -> str:
        if (
            not self._fast
            or record.exc_info
            or record.exc_text
            or record.stack_info
            or isinstance(record.msg, dict)
        ):
            return super().format(record)
        record.message = record.getMessage()
        if self._wants_asctime:
            record.asctime = self.formatTime(record, self.datefmt)
        fields = record.__dict__
        data = {name: fields.get(field) for field, name in self._required}
        # which of the record's attributes are written, and under what name, is decided once
        # per set of attributes (every access line has the same): not key by key on every line
        shape = tuple(fields)
        extras = self._extras.get(shape)
        if extras is None:
            extras = self._extras_of(shape)
        for key, name in extras:
            data[name] = fields[key]
        try:
            return json_text.spaced(data)  # json.dumps(data)'s text
        except (TypeError, ValueError, RecursionError):  # a value only the library's encoder can write
            return self.jsonify_log_record(data)


def record_time() -> tuple[float, float]:
    """``created`` and ``msecs`` of a LogRecord made now, as this Python's logging works them out."""
    if sys.version_info >= (3, 13):
        now_ns = time.time_ns()
        created = now_ns / 1e9
        msecs = (now_ns % 1_000_000_000) // 1_000_000 + 0.0
        if msecs == 999.0 and int(created) != now_ns // 1_000_000_000:
            msecs = 0.0  # the float seconds rounded up into the next second
        return created, msecs
    now = time.time()
    return now, int((now - int(now)) * 1000) + 0.0


class DirectLines:
    """One logger's plain INFO lines written to its handler without a LogRecord, when nothing else
    would see the record: logging set up as :func:`logging_config` sets it up (one stream handler
    on the logger's path, its JSON formatter and :class:`RequestIdFilter`, no filter on the
    logger, the stock record factory).

    Every request writes an access line, and making the record (time, pid, thread, process
    name, source) and passing it through the logger and the handler cost more than formatting
    it. :meth:`write` gives the same text to the same stream under the handler's lock, and says
    False whenever anything else is set up (another handler, pytest's capture, a filter, another
    format): the caller then logs as usual.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def handler(self) -> logging.StreamHandler[Any] | None:
        """The one handler a record of this logger would reach, if a line can go to it directly."""
        logger = self.logger
        if logger.filters or logger.disabled or logging.getLogRecordFactory() is not logging.LogRecord:
            return None
        found: logging.Handler | None = None
        current: logging.Logger | None = logger
        while current is not None:  # the handlers Logger.callHandlers would call
            for handler in current.handlers:
                if found is not None:
                    return None
                found = handler
            if not current.propagate:
                break
            current = current.parent
        if type(found) is not logging.StreamHandler or found.level > logging.INFO:
            return None
        formatter = found.formatter
        filters = found.filters
        if not isinstance(formatter, JsonFormatter) or not formatter.direct:
            return None
        # RequestIdFilter adds request_id only to a record without one: the caller's fields have it
        if len(filters) != 1 or type(filters[0]) is not RequestIdFilter:
            return None
        return found

    def write(self, message: str, fields: Mapping[str, Any]) -> bool:
        """Write an INFO line of ``message`` and ``fields`` (which hold a ``request_id``, and no
        LogRecord attribute); False if it has to be logged as usual instead."""
        handler = self.handler()
        if handler is None:
            return False
        formatter: JsonFormatter = handler.formatter  # type: ignore[assignment]
        created, msecs = record_time()
        line = formatter.direct_line(created, msecs, logging.INFO, self.logger.name, message, fields)
        if line is None:
            return False
        handler.acquire()
        try:
            # StreamHandler.emit and flush, as one
            stream = handler.stream
            stream.write(line + handler.terminator)
            if hasattr(stream, "flush"):
                stream.flush()
        except RecursionError:
            raise
        except Exception:
            handler.handleError(
                self.logger.makeRecord(self.logger.name, logging.INFO, "", 0, message, (), None, extra=fields)
            )
        finally:
            handler.release()
        return True


# What every LogRecord has; the rest of a record's attributes are its ``extra`` fields.
_RECORD_ATTRIBUTES = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "request_id"}


# A value written bare in a console line: printable ASCII but the space, '"', '=' and '\\', so it
# can neither end early nor start a key=value of its own.
_BARE_VALUE = re.compile(r"[!#-<>-\[\]-~]+")


def console_value(value: object) -> str:
    """``value`` as a console line writes it: bare when it cannot be misread, else a JSON string
    (quoted, with the escapes the JSON format writes). A client chooses some of these values (the
    access line's ``client`` is X-Forwarded-For's, with TRUSTED_PROXY_HOPS set): written raw,
    ``1.2.3.4 status=200 route=/admin`` read as three fields, and a newline as a second line."""
    text = str(value)
    return text if _BARE_VALUE.fullmatch(text) else json.dumps(text)


def _printable(text: str) -> str:
    """``text`` with every character that is not printable (line ends, ESC, bidi controls) written as
    its JSON escape: a message is prose, left unquoted, but stays on its one line."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else json.dumps(char)[1:-1] for char in text)


class ConsoleFormatter(logging.Formatter):
    """``TOKEN_SERVICE_LOG_FORMAT=console`` (``make run``): a line a person reads in a terminal.

    Time, level, logger and message, then the record's extra fields as ``key=value`` (the
    access line's route, status, timings), each value escaped by :func:`console_value`.
    Not for production: JSON is what collectors parse.
    """

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")

    def formatMessage(self, record: logging.LogRecord) -> str:
        message = record.message
        record.message = _printable(message)
        try:
            return super().formatMessage(record)
        finally:
            record.message = message

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = [
            f"{key}={console_value(value)}"
            for key, value in record.__dict__.items()
            if key not in _RECORD_ATTRIBUTES and not key.startswith("_")
        ]
        request_id = getattr(record, "request_id", None)
        if request_id:
            extra.append(f"request_id={console_value(request_id)}")
        return f"{line} {' '.join(extra)}" if extra else line


def logging_config(level: str = "INFO", log_format: str = "json") -> dict[str, Any]:
    handler = {
        "class": "logging.StreamHandler",
        "formatter": log_format,
        "filters": ["request_id"],
        "stream": "ext://sys.stderr",
    }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {
            "request_id": {"()": "token_service.server.logs.RequestIdFilter"},
            "redact_gunicorn": {"()": "token_service.server.connections.RedactGunicornErrors"},
        },
        "formatters": {
            "json": {
                "()": "token_service.server.logs.JsonFormatter",
                "fmt": JSON_FORMAT,
                "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
            },
            "console": {"()": "token_service.server.logs.ConsoleFormatter"},
        },
        "handlers": {"json": handler},
        "root": {"level": level, "handlers": ["json"]},
        "loggers": {
            # gunicorn's own loggers: same handler, no second copy through the root
            "gunicorn.error": {
                "level": level,
                "handlers": ["json"],
                "filters": ["redact_gunicorn"],
                "propagate": False,
            },
            "gunicorn.access": {"level": "WARNING", "handlers": [], "propagate": False},
        },
    }
