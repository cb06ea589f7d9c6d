"""The fast JSON formatter writes exactly what python-json-logger writes; the console format escapes
every value as the JSON one does, so no client-chosen value writes a field or a line of its own."""

from __future__ import annotations

import datetime
import enum
import json
import logging
import re
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pythonjsonlogger.json import JsonFormatter as LibraryJsonFormatter

from token_service.server.logs import JSON_FORMAT, ConsoleFormatter, JsonFormatter, logging_config

OPTIONS = logging_config()["formatters"]["json"]


def formatters(**options: Any) -> tuple[logging.Formatter, logging.Formatter]:
    kwargs = {"fmt": OPTIONS["fmt"], "rename_fields": OPTIONS["rename_fields"], **options}
    return JsonFormatter(**kwargs), LibraryJsonFormatter(**kwargs)


def record(msg: Any = "request", args: Any = (), exc_info: Any = None, **extra: Any) -> logging.LogRecord:
    logger = logging.getLogger("token_service.access")
    return logger.makeRecord(logger.name, logging.INFO, __file__, 1, msg, args, exc_info, extra=extra)


class Colour(enum.Enum):
    RED = "red"


class Level(enum.StrEnum):
    HIGH = "high"


def test_the_service_config_uses_this_formatter() -> None:
    assert OPTIONS["()"] == "token_service.server.logs.JsonFormatter"
    assert OPTIONS["fmt"] == JSON_FORMAT


ACCESS = {
    "request_id": "r" * 32,
    "method": "POST",
    "route": "/token/generate",
    "status": 201,
    "duration_ms": 1.234,
    "client": "127.0.0.1",
}


@pytest.mark.parametrize(
    "make",
    [
        lambda: record(**ACCESS),
        lambda: record(**ACCESS, token_ref="abcdefgh"),
        lambda: record("worker %s booted: %d", ("w1", 42)),
        lambda: record(**{"é": "ü ☃ \x1f\"'", "none": None, "flag": True, "nan": float("nan")}),
        lambda: record(when=datetime.datetime(2026, 1, 2, 3, 4, 5)),  # the library's encoder
        lambda: record(colour=Colour.RED, level=Level.HIGH, raw=b"\x00"),
        lambda: record({"a dict": "message"}),
        lambda: record(nested={"list": [1, 2.5, "x"], "n": None}),
    ],
)
def test_same_line_as_python_json_logger(make: Any) -> None:
    fast, library = formatters()
    one = make()
    two = logging.makeLogRecord(dict(one.__dict__))
    assert fast.format(one) == library.format(two)


def test_same_line_with_an_exception_and_a_stack() -> None:
    fast, library = formatters()
    try:
        raise ValueError("boom")
    except ValueError:
        info = sys.exc_info()
    one = record("failed", exc_info=info, request_id="x")
    two = record("failed", exc_info=info, request_id="x")
    two.created, two.msecs = one.created, one.msecs
    assert fast.format(one) == library.format(two)
    one.exc_info = two.exc_info = None
    one.exc_text = two.exc_text = None
    one.stack_info = two.stack_info = "Stack (most recent call last):\n  here"
    assert fast.format(one) == library.format(two)


SHARED = formatters()


@settings(deadline=None)  # hypothesis's 200 ms per example is a speed check a loaded CI machine fails
@given(
    st.dictionaries(
        st.text(min_size=1).filter(lambda k: k not in logging.LogRecord("", 0, "", 0, "", (), None).__dict__),
        st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text()),
        max_size=6,
    ),
    st.floats(min_value=0, max_value=4e9),
)
def test_same_line_for_any_plain_extra(extra: dict[str, Any], created: float) -> None:
    fast, library = SHARED  # one pair across examples: the time cache sees many seconds
    one = record(**{k: v for k, v in extra.items() if k not in ("message", "asctime")})
    one.created, one.msecs = created, (created - int(created)) * 1000
    two = logging.makeLogRecord(dict(one.__dict__))
    assert fast.format(one) == library.format(two)


@pytest.mark.parametrize(
    "options",
    [
        {"json_indent": 2},
        {"json_ensure_ascii": False},
        {"static_fields": {"service": "token-service"}},
        {"timestamp": True},
        {"datefmt": "%H:%M"},
        {"prefix": "> "},
    ],
)
def test_other_configurations_take_the_library_path(options: dict[str, Any]) -> None:
    fast, library = formatters(**options)
    one = record(**ACCESS, text="ü")
    two = logging.makeLogRecord(dict(one.__dict__))
    assert fast.format(one) == library.format(two)


@pytest.fixture
def restore_logging() -> Any:
    """gunicorn's logger applies its logconfig_dict to the process: put everything back."""
    names = ["", "gunicorn.error", "gunicorn.access"]
    saved = [
        (lg, lg.level, list(lg.handlers), lg.propagate, lg.disabled)
        for lg in (logging.getLogger(name) for name in names)
    ]
    yield
    for lg, level, handlers, propagate, disabled in saved:
        lg.setLevel(level)
        lg.handlers[:] = handlers
        lg.propagate, lg.disabled = propagate, disabled


def test_gunicorn_builds_no_access_fields_nobody_writes(restore_logging: Any) -> None:
    from gunicorn.config import Config

    from token_service.server.gunicorn_logger import GunicornLogger

    class Counting(GunicornLogger):  # type: ignore[misc]
        built = 0

        def atoms(self, *args: Any) -> dict[str, Any]:
            Counting.built += 1
            return {}

    cfg = Config()
    cfg.set("logconfig_dict", logging_config())
    logger = Counting(cfg)
    assert not logger.access_log_enabled
    logger.access(None, None, {}, None)
    assert Counting.built == 0

    # a config that does write gunicorn's access lines gets them, built as before
    enabled = logging_config()
    enabled["loggers"]["gunicorn.access"] = {"level": "INFO", "handlers": [], "propagate": False}
    cfg.set("logconfig_dict", enabled)
    logger = Counting(cfg)
    assert logger.access_log_enabled
    logger.access(None, None, {}, None)
    assert Counting.built == 1


# -- the console format (make run's) ------------------------------------------------------------

# logfmt as a reader parses it: key=value, a value bare or a JSON string
CONSOLE_FIELD = re.compile(r' ([A-Za-z_]\w*)=("(?:[^"\\]|\\.)*"|[^ "]*)(?= |$)')
SPOOFED = "1.2.3.4 status=200 route=/admin"


def console_fields(line: str) -> list[tuple[str, Any]]:
    """The ``key=value`` fields after the message, in order, their values decoded."""
    return [
        (key, json.loads(value) if value.startswith('"') else value)
        for key, value in CONSOLE_FIELD.findall(line)
    ]


@pytest.fixture
def console_lines() -> Any:
    """The access log as ``TOKEN_SERVICE_LOG_FORMAT=console`` writes it."""
    lines: list[str] = []
    formatter = ConsoleFormatter()

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(formatter.format(record))

    handler = Capture()
    logger = logging.getLogger("token_service.access")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(old_level)


@pytest.mark.parametrize("route", ["/token/generate", "/healthz"])
def test_a_forwarded_address_cannot_write_fields_of_its_own(
    make_client: Any, console_lines: list[str], route: str
) -> None:
    client = make_client(trusted_proxy_hops=1, rate_limit="off")
    if route == "/healthz":
        client.get(route, headers={"X-Forwarded-For": SPOOFED})
    else:
        client.post(route, json={"scope": "pay"}, headers={"X-Forwarded-For": SPOOFED})
    [line] = console_lines
    fields = console_fields(line)
    names = [name for name, _ in fields]
    assert names.count("status") == names.count("route") == names.count("client") == 1, line
    assert dict(fields)["client"] == SPOOFED
    assert dict(fields)["route"] == route
    assert int(dict(fields)["status"]) < 300


def test_every_console_value_and_message_stays_on_its_line() -> None:
    formatter = ConsoleFormatter()
    hostile = "x\r\nINFO    token_service.access: request status=200\x1b[2J\u202e"
    message = "worker x\r\nERROR   token_service: forged\x1b[2J\u202e"
    line = formatter.format(record(message, client=hostile, path='a"b\\c', empty=""))
    assert not set(line) & {"\n", "\r", "\x1b", "\u202e"}
    assert line.split(": ", 1)[1].startswith("worker x\\r\\nERROR   token_service: forged\\u001b[2J\\u202e ")
    fields = dict(console_fields(line))
    assert (fields["client"], fields["path"], fields["empty"]) == (hostile, 'a"b\\c', "")
    # what a person reads stays bare where nothing can be misread
    plain = formatter.format(record(**ACCESS, token_ref="abcdefgh"))
    assert plain.endswith(
        " method=POST route=/token/generate status=201 duration_ms=1.234 client=127.0.0.1"
        " token_ref=abcdefgh request_id=" + "r" * 32
    )


# -- the access line written without a LogRecord (logs.DirectLines) ------------------------------


@pytest.fixture
def service_logging(monkeypatch: pytest.MonkeyPatch) -> Any:
    """logging_config() applied, its handler writing to a buffer; logging put back afterwards."""
    import io
    import logging.config

    names = ["", "gunicorn.error", "gunicorn.access", "token_service.access"]
    saved = [
        (lg, lg.level, list(lg.handlers), list(lg.filters), lg.propagate, lg.disabled)
        for lg in (logging.getLogger(name) for name in names)
    ]
    logging.config.dictConfig(logging_config())
    buffer = io.StringIO()
    (handler,) = logging.getLogger().handlers
    handler.setStream(buffer)  # type: ignore[attr-defined]
    # one instant for both paths: 1.9995 s into a second, where the milliseconds round
    monkeypatch.setattr("time.time", lambda: 1_765_000_000.9995)
    monkeypatch.setattr("time.time_ns", lambda: 1_765_000_000_999_500_000)
    yield buffer, handler
    for lg, level, handlers, filters, propagate, disabled in saved:
        lg.setLevel(level)
        lg.handlers[:] = handlers
        lg.filters[:] = filters
        lg.propagate, lg.disabled = propagate, disabled


def only_the_service_handler(handler: logging.Handler) -> None:
    """pytest's logging plugin adds its capture handlers to the root logger around each test's
    body (so no line goes directly under pytest): take them off for this test."""
    logging.getLogger().handlers[:] = [handler]


def access_line(token_ref: str | None, direct: bool) -> None:
    from token_service.server import telemetry
    from token_service.server.request_context import RequestInfo

    info = RequestInfo("r" * 32, token_ref)
    if direct:
        telemetry.record(info, "POST", "/token/consume", 200, 0.0012345, "10.0.0.1")
        return
    write = telemetry._direct_access.write
    telemetry._direct_access.write = lambda *args: False  # type: ignore[method-assign]
    try:
        telemetry.record(info, "POST", "/token/consume", 200, 0.0012345, "10.0.0.1")
    finally:
        telemetry._direct_access.write = write  # type: ignore[method-assign]


@pytest.mark.parametrize("token_ref", [None, "abcdefghijklmnopqrstuv"])
def test_the_direct_access_line_is_the_records_line(service_logging: Any, token_ref: str | None) -> None:
    from token_service.server import telemetry

    buffer, handler = service_logging
    only_the_service_handler(handler)
    assert telemetry._direct_access.handler() is handler
    access_line(token_ref, direct=True)
    direct = buffer.getvalue()
    buffer.seek(0)
    buffer.truncate()
    access_line(token_ref, direct=False)
    assert direct == buffer.getvalue()
    assert direct.count("\n") == 1
    assert json.loads(direct)["status"] == 200


def _another_handler(handler: logging.Handler) -> None:
    logging.getLogger("token_service.access").addHandler(logging.NullHandler())


def _a_filter_on_the_logger(handler: logging.Handler) -> None:
    logging.getLogger("token_service.access").addFilter(lambda record: True)


def _a_filter_on_the_handler(handler: logging.Handler) -> None:
    handler.addFilter(lambda record: True)


def _the_console_format(handler: logging.Handler) -> None:
    handler.setFormatter(ConsoleFormatter())


def _another_json_format(handler: logging.Handler) -> None:
    handler.setFormatter(JsonFormatter("%(asctime)s %(process)d %(message)s"))


def _a_level_above_info(handler: logging.Handler) -> None:
    handler.setLevel(logging.WARNING)


def _no_propagation(handler: logging.Handler) -> None:
    logging.getLogger("token_service.access").propagate = False


@pytest.mark.parametrize(
    "change",
    [
        _another_handler,
        _a_filter_on_the_logger,
        _a_filter_on_the_handler,
        _the_console_format,
        _another_json_format,
        _a_level_above_info,
        _no_propagation,
    ],
)
def test_any_other_logging_setup_gets_its_record(service_logging: Any, change: Any) -> None:
    from token_service.server import telemetry

    handler = service_logging[1]
    only_the_service_handler(handler)
    change(handler)
    assert telemetry._direct_access.handler() is None
    seen: list[logging.LogRecord] = []

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    logging.getLogger("token_service.access").addHandler(Seen())
    access_line(None, direct=True)
    assert [record.getMessage() for record in seen] == ["request"]
    assert seen[0].route == "/token/consume"  # type: ignore[attr-defined]


def test_a_record_factory_of_ones_own_gets_its_record(service_logging: Any) -> None:
    from token_service.server import telemetry

    only_the_service_handler(service_logging[1])
    factory = logging.getLogRecordFactory()
    logging.setLogRecordFactory(lambda *args, **kwargs: factory(*args, **kwargs))
    try:
        assert telemetry._direct_access.handler() is None
    finally:
        logging.setLogRecordFactory(factory)
    assert telemetry._direct_access.handler() is not None


def test_a_failed_write_is_the_handlers_to_report(
    service_logging: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    buffer, handler = service_logging
    only_the_service_handler(handler)
    reported: list[logging.LogRecord] = []
    monkeypatch.setattr(handler, "handleError", reported.append)
    buffer.close()  # writing to it raises ValueError, as StreamHandler.emit would meet it
    access_line(None, direct=True)
    assert [record.getMessage() for record in reported] == ["request"]
