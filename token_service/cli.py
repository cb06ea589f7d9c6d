"""The ``token-service`` command: ``serve`` runs gunicorn, ``check`` validates config and Redis."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from token_service.config import ConfigError, Settings


def _settings_or_exit() -> Settings:
    try:
        return Settings.from_env(os.environ)
    except ConfigError as exc:
        print(f"token-service: configuration error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def serve(args: argparse.Namespace) -> int:
    settings = _settings_or_exit()
    workers = args.workers
    if settings.embedded and workers not in (None, 1):
        print(
            "token-service: the embedded in-memory store lives in one process; "
            f"running 1 worker instead of {workers} (set TOKEN_SERVICE_REDIS_URL for more).",
            file=sys.stderr,
        )
    if settings.embedded:
        workers = 1
    argv = [
        "gunicorn",
        "--config",
        "python:token_service.gunicorn_conf",
        "--bind",
        f"{args.host}:{args.port}",
    ]
    if workers is not None:
        argv += ["--workers", str(workers)]
    argv.append("token_service:create_app()")
    from gunicorn.app.wsgiapp import run

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
    from token_service.connection import redis_client
    from token_service.errors import ServiceUnavailable
    from token_service.store import TokenStore

    try:
        TokenStore(redis_client(settings), key_prefix=settings.key_prefix).ready()
    except ServiceUnavailable as exc:
        print(f"Redis: NOT reachable ({exc.detail})", file=sys.stderr)
        return 1
    print("Redis: reachable, scripts loaded.")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="token-service", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve_cmd = commands.add_parser("serve", help="run the HTTP service under gunicorn")
    serve_cmd.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    serve_cmd.add_argument("--port", type=int, default=8000, help="port to bind (default: 8000)")
    serve_cmd.add_argument(
        "--workers", type=int, default=None, help="gunicorn workers (default: WEB_CONCURRENCY or 2)"
    )
    serve_cmd.set_defaults(handler=serve)
    check_cmd = commands.add_parser("check", help="validate the configuration and ping Redis")
    check_cmd.set_defaults(handler=check)
    args = parser.parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    raise SystemExit(main())
