"""The ``token-service`` command: ``serve`` runs gunicorn (or granian), ``check`` validates config and Redis,
``db-cleanup`` deletes expired idempotency records from a business database, ``admin``
finds, shows, revokes, releases and lists records and reconciles stuck operations."""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from collections.abc import Sequence

from token_service import __version__
from token_service.config import SERVERS, ConfigError, Settings, unknown_variables

__all__ = [
    "DESCRIPTION",
    "NO_KEYS_WARNING",
    "busy_port_message",
    "check",
    "db_cleanup",
    "duration_seconds",
    "free_port_near",
    "main",
    "port_in_use",
    "positive_int",
    "serve",
]

NO_KEYS_WARNING = (
    "WARNING: TOKEN_SERVICE_API_KEYS is empty: every backend call (consume, begin, complete, fail, "
    "inspect, revoke) will be refused with 401 unauthorized. Set at least one service key."
)

# --help is read in a terminal: plain text, not the docstring's markup.
DESCRIPTION = (
    "Run and operate token-service. Settings come from the TOKEN_SERVICE_* environment "
    "variables (token-service check prints them)."
)


def _settings_or_exit() -> Settings:
    """The settings, or exit 2 naming each bad value and each unknown TOKEN_SERVICE_* variable."""
    unknown = unknown_variables(os.environ)
    for message in unknown:
        print(f"token-service: configuration error: {message}", file=sys.stderr)
    try:
        settings = Settings.from_env(os.environ)
    except ConfigError as exc:
        print(f"token-service: configuration error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if unknown:
        raise SystemExit(2)
    if not settings.api_keys and not settings.embedded:
        print(f"token-service: {NO_KEYS_WARNING}", file=sys.stderr)
    if settings.development_warning:
        print(f"token-service: WARNING: {settings.development_warning}", file=sys.stderr)
    return settings


def port_in_use(host: str, port: int) -> bool:
    """Whether something already listens on ``host:port`` (checked before gunicorn starts).

    gunicorn would retry for 5 s and then say only ``Can't connect to ('127.0.0.1', 8000)``;
    a newcomer with another server on 8000 needs the setting that moves ours. SO_REUSEADDR as
    gunicorn sets it, so a port in TIME_WAIT is free here as it is for gunicorn.
    """
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return False  # gunicorn names an unknown host itself
    for family, kind, proto, _name, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
    return False


# The checkout's own defaults (README, "Ports"): a port suggested for one must not be another's.
_DEFAULT_PORTS = frozenset({8000, 8001, 8100, 8200, 8300})


def free_port_near(host: str, port: int) -> int | None:
    """A port to suggest in place of a busy ``port``: the first of port+10, port+20, ... that
    is free now and no other default of the checkout's; None if none of ten is."""
    for candidate in range(port + 10, min(port + 110, 65536), 10):
        if candidate not in _DEFAULT_PORTS and not port_in_use(host, candidate):
            return candidate
    return None


def busy_port_message(host: str, port: int, change: str) -> str:
    """What to say of a busy port; ``change`` formats the way to pick another (``{port}``)."""
    free = free_port_near(host, port)
    how = change.format(port=free) if free is not None else change.format(port="<another port>")
    return f"port {port} on {host} is in use (another server?); choose another: {how}"


def serve(args: argparse.Namespace) -> int:
    settings = _settings_or_exit()
    if port_in_use(args.host, args.port):
        how = "--port {port} (make run: PORT={port} make run)"
        print(f"token-service: {busy_port_message(args.host, args.port, how)}", file=sys.stderr)
        return 2
    workers = args.workers
    if settings.embedded and workers not in (None, 1):
        print(
            "token-service: the embedded in-memory store lives in one process; "
            f"running 1 worker instead of {workers} (set TOKEN_SERVICE_REDIS_URL for more).",
            file=sys.stderr,
        )
    if settings.embedded:
        workers = 1
    if settings.redis_url and settings.redis_target.kind == "cluster":
        # A cluster client asks its nodes for the slot map when it is made, in each worker as it
        # boots: a node that is no cluster node (or none reachable) would kill every worker with a
        # traceback. Asked once here, it is the one line `check` says, and serve exits 1.
        line = _unreachable_line(settings)
        if line is not None:
            print(line, file=sys.stderr)
            return 1
    if (args.server or settings.server) == "granian":
        from token_service.server import granian_serve

        return granian_serve.serve(settings, args.host, args.port, workers)
    argv = [
        "gunicorn",
        "--config",
        "python:token_service.server.gunicorn_conf",
        "--bind",
        f"{args.host}:{args.port}",
    ]
    if workers is not None:
        argv += ["--workers", str(workers)]
    argv.append("token_service:create_app()")
    try:
        import flask  # noqa: F401 — what the workers import, checked before gunicorn forks them
        import gevent  # noqa: F401
        from gunicorn.app.wsgiapp import run
    except ImportError as exc:
        print(
            "token-service: serve needs the server extra "
            f"(pip install 'idempotency-token-service[server]'): {exc}",
            file=sys.stderr,
        )
        return 2

    sys.argv = argv
    run()
    return 0


def check(args: argparse.Namespace) -> int:
    settings = _settings_or_exit()
    print("Effective configuration (secrets masked):")
    for name, value in settings.describe().items():
        print(f"  {name}={value}")
    if settings.embedded:
        print("Store: embedded in-memory (nothing to ping; nothing survives a restart).")
        return 0
    from token_service.connection import request_budget_seconds

    # What a proxy's read timeout and the probes' timeouts are set from (docs/configuration.md)
    print(f"Redis budget per request: {request_budget_seconds(settings):g} s (the worst case before a 503)")
    line = _unreachable_line(settings, load_scripts=True)
    if line is not None:
        print(line, file=sys.stderr)
        return 1
    print("Redis: reachable, scripts loaded.")
    return 0


def _unreachable_line(settings: Settings, *, load_scripts: bool = False) -> str | None:
    """None when the Redis of the settings can be reached (with ``load_scripts``, pinged and our
    scripts loaded; without, only its client made); else the one line that says why not: the
    setting (its URL, password masked), what it means, and Redis's own words, which name the
    host and port or the refusal (the service's 503 does not)."""
    from token_service.connection import redis_client
    from token_service.errors import ServiceUnavailable
    from token_service.store import TokenStore, translate_errors

    try:
        with translate_errors():  # a cluster client asks its nodes for the slot map when made
            client = redis_client(settings)
        if load_scripts:
            TokenStore(client, key_prefix=settings.key_prefix).ready()
    except ServiceUnavailable as exc:
        url = settings.describe()["TOKEN_SERVICE_REDIS_URL"]
        said = f" [{exc.__cause__}]" if exc.__cause__ is not None else ""
        return f"Redis: NOT reachable at TOKEN_SERVICE_REDIS_URL={url}: {exc.detail}{said}"
    client.close()  # the workers make their own; this one was only asked
    return None


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_seconds(text: str) -> int:
    """``90``, ``90s``, ``15m``, ``2h`` or ``7d`` → seconds."""
    text = text.strip().lower()
    unit = text[-1:] if text[-1:] in _DURATION_UNITS else "s"
    number = text[:-1] if text[-1:] in _DURATION_UNITS else text
    if not number.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 15m, 2h or 7d")
    return int(number) * _DURATION_UNITS[unit]


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def db_cleanup(args: argparse.Namespace) -> int:
    try:
        import sqlalchemy as sa

        from token_service.client.durable import delete_expired, records_table
    except ImportError as exc:
        print(
            "token-service: db-cleanup needs the db extra "
            f"(pip install 'idempotency-token-service[db]'): {exc}",
            file=sys.stderr,
        )
        return 2
    try:
        engine = sa.create_engine(args.url)
    except (sa.exc.ArgumentError, ImportError) as exc:
        print(f"token-service: cannot use database URL: {exc}", file=sys.stderr)
        return 2
    table = records_table(args.table, schema=args.schema)
    name = f"{args.schema}.{args.table}" if args.schema else args.table

    def progress(deleted: int, total: int) -> None:
        print(f"db-cleanup: deleted {deleted} records in this batch, {total} so far", flush=True)

    try:
        total = delete_expired(
            engine,
            table=table,
            older_than_seconds=args.older_than,
            batch_size=args.batch_size,
            pause_seconds=args.pause,
            progress=progress,
        )
    except sa.exc.SQLAlchemyError as exc:
        reason = getattr(exc, "orig", None) or exc
        print(f"token-service: db-cleanup failed on {name}: {reason}", file=sys.stderr)
        return 1
    finally:
        engine.dispose()
    print(f"db-cleanup: done, {total} expired records deleted from {name}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="token-service", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_cmd = commands.add_parser("serve", help="run the HTTP service under gunicorn or granian")
    serve_cmd.add_argument(
        "--server",
        choices=SERVERS,
        default=None,
        help="the HTTP server (default: TOKEN_SERVICE_SERVER, else gunicorn; granian: the granian extra)",
    )
    serve_cmd.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    serve_cmd.add_argument("--port", type=int, default=8000, help="port to bind (default: 8000)")
    serve_cmd.add_argument(
        "--workers",
        type=int,
        default=None,
        help="gunicorn workers (default: WEB_CONCURRENCY, else the CPU count)",
    )
    serve_cmd.set_defaults(handler=serve)
    check_cmd = commands.add_parser("check", help="validate the configuration and ping Redis")
    check_cmd.set_defaults(handler=check)
    cleanup_cmd = commands.add_parser(
        "db-cleanup", help="delete expired idempotency records from a database, in small batches"
    )
    cleanup_cmd.add_argument(
        "--url", required=True, help="SQLAlchemy URL, e.g. postgresql+psycopg://user@host/db"
    )
    cleanup_cmd.add_argument("--table", default="idempotency_records", help="(default: idempotency_records)")
    cleanup_cmd.add_argument("--schema", default=None, help="schema of the table (default: the URL's)")
    cleanup_cmd.add_argument(
        "--older-than",
        type=duration_seconds,
        default=0,
        help="only records that expired at least this long ago: 90s, 15m, 2h, 7d (default: 0)",
    )
    cleanup_cmd.add_argument(
        "--batch-size", type=positive_int, default=1000, help="rows per transaction (default: 1000)"
    )
    cleanup_cmd.add_argument("--pause", type=float, default=0.0, help="seconds to sleep between batches")
    cleanup_cmd.set_defaults(handler=db_cleanup)
    from token_service.server import admin_cli

    admin_cli.add_parser(commands)
    args = parser.parse_args(admin_cli.dashed_refs_last(sys.argv[1:] if argv is None else argv))
    return int(args.handler(args))


if __name__ == "__main__":
    raise SystemExit(main())
