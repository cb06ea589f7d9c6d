"""``token-service admin …``: the operators' tools of :mod:`token_service.ops.admin` on the command line.

Each command prints one JSON object per line on stdout (records, or what was
done) and writes its audit line (JSON) on stderr. Exit status: 0 done, 1 not
found / refused / Redis unavailable, 2 bad usage or configuration.
"""

from __future__ import annotations

import argparse
import getpass
import importlib
import json
import logging.config
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from token_service.errors import TokenError
from token_service.tokens import whole_number

__all__ = [
    "PAGE_RECORDS",
    "add_parser",
    "dashed_refs_last",
    "find",
    "list_records",
    "reconcile",
    "release",
    "revoke",
    "run",
    "show",
]

_KINDS = ("token", "idempotency")
PAGE_RECORDS = 100
_DASHED_REF = re.compile(r"-[A-Za-z0-9_-]{5,}")


def _emit(document: Any) -> None:
    print(json.dumps(document, separators=(",", ":"), default=str), flush=True)


def _admin(args: argparse.Namespace) -> Any:
    from token_service.config import ConfigError, Settings, unknown_variables
    from token_service.connection import redis_client
    from token_service.ops.admin import Admin
    from token_service.server.logs import logging_config

    # A misspelt variable (TOKEN_SERVICE_REDIS_UR) would leave the default in force: an operator
    # could walk another Redis than the service's. Refused as serve and check refuse it.
    unknown = unknown_variables(os.environ)
    if unknown:
        raise _UsageError("configuration error: " + "; ".join(unknown))
    try:
        settings = Settings.from_env(os.environ)
    except ConfigError as exc:
        raise _UsageError(f"configuration error: {exc}") from None
    if settings.embedded:
        raise _UsageError("admin needs TOKEN_SERVICE_REDIS_URL (the embedded store is the server's own)")
    logging.config.dictConfig(logging_config(settings.log_level, settings.log_format))
    return Admin(
        redis_client(settings),
        key_prefix=settings.key_prefix,
        result_ttl_seconds=settings.result_ttl_seconds,
        actor=f"cli:{getpass.getuser()}",
    )


class _UsageError(Exception):
    pass


def _identity(text: str) -> str:
    # "-": read it from stdin, so a credential stays out of the shell history and of ps
    if text != "-":
        return text
    try:
        return sys.stdin.readline().rstrip("\r\n")
    except UnicodeDecodeError:
        raise _UsageError("the identity read from stdin is not UTF-8") from None


def show(args: argparse.Namespace) -> int:
    admin = _admin(args)
    if args.idempotency_key is not None:
        if args.identity is None:
            raise _UsageError("--idempotency-key needs --identity (the client identity it was keyed on)")
        _emit(admin.show_idempotency(_identity(args.identity), args.idempotency_key).to_dict())
        return 0
    if args.ref is None:
        raise _UsageError("give a ref (the token_ref of a log line) or --idempotency-key with --identity")
    if len(args.ref) < 22:
        # an older, shorter token_ref: walk the keyspace for the records it may be, of either
        # kind unless --kind says which (an Idempotency-Key record's ref is as short in its logs)
        from token_service.errors import RecordNotFound
        from token_service.ops.admin import Filter, check_ref

        check_ref(args.ref)
        found = 0
        for record in admin.walk(Filter(kind=args.kind, ref_prefix=args.ref), count=args.count):
            _emit(record.to_dict())
            found += 1
        admin._audit("find_by_ref_prefix", args.ref, f"{found} found")
        if not found:  # said, as for a whole ref, not an empty answer with exit 1
            kind = f"{args.kind} " if args.kind else ""
            raise RecordNotFound(
                f"No {kind}record's ref starts with {args.ref} (expired, deleted, or never)."
            )
        return 0
    _emit(admin.show(args.ref, args.kind).to_dict())
    return 0


def find(args: argparse.Namespace) -> int:
    from token_service.ops.admin import Filter

    admin = _admin(args)
    found = 0
    for record in admin.walk(Filter(kind="token", request_id=args.request_id), count=args.count):
        _emit(record.to_dict())
        found += 1
    admin._audit("find_by_request_id", None, f"{found} found")
    return 0 if found else 1


def revoke(args: argparse.Namespace) -> int:
    admin = _admin(args)
    record = admin.revoke(args.ref, args.kind)
    _emit({"outcome": "revoked", "kind": record.kind, "ref": record.ref, "was": record.state})
    return 0


def release(args: argparse.Namespace) -> int:
    admin = _admin(args)
    outcome = admin.release(args.ref, args.kind)
    _emit({"outcome": outcome, "ref": args.ref})
    return 0


def list_records(args: argparse.Namespace) -> int:
    from token_service.ops.admin import Filter

    admin = _admin(args)
    wanted = Filter(kind=args.kind, state=args.state, scope=args.scope)
    cursor, shown = args.cursor, 0
    while shown < args.limit:
        # pages of at most PAGE_RECORDS: what the command holds at once, however large --limit
        page = admin.list(wanted, cursor, args.count, min(args.limit - shown, PAGE_RECORDS))
        for record in page.records:
            _emit(record.to_dict())
        shown += len(page.records)
        cursor = page.cursor
        if page.done:
            break
    # where to go on from (a page may stop at --limit mid-walk)
    _emit({"cursor": cursor, "done": cursor == "0", "shown": shown})
    return 0


def _handler(path: str) -> Callable[..., Any]:
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise _UsageError(f"--handler must be module:function, got {path!r}")
    sys.path.insert(0, os.getcwd())
    try:
        handler = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise _UsageError(f"cannot load the handler {path!r}: {exc}") from None
    if not callable(handler):
        raise _UsageError(f"{path!r} is not callable")
    return handler  # type: ignore[no-any-return]


def _never(*args: Any) -> Any:
    raise AssertionError("a dry run hands nothing over")


def reconcile(args: argparse.Namespace) -> int:
    from token_service.ops import reconcile as reconciler

    handler = _never if args.dry_run else _handler(args.decide_with or "")
    if args.db_url:
        import sqlalchemy as sa

        from token_service.client.durable import records_table

        engine = sa.create_engine(args.db_url)
        try:
            done = reconciler.reconcile_durable(
                engine,
                handler,
                table=records_table(args.table, schema=args.schema),
                dry_run=args.dry_run,
                lease_seconds=args.lease_seconds,
                actor=f"cli:{getpass.getuser()}",
            )
        finally:
            engine.dispose()
    else:
        admin = _admin(args)
        done = reconciler.reconcile(admin, handler, dry_run=args.dry_run, lease_seconds=args.lease_seconds)
    for item in done:
        _emit(
            {
                "source": item.stuck.source,
                "ref": item.stuck.ref,
                "request_id": item.stuck.request_id,
                "lease_expired_at": item.stuck.lease_expired_at,
                "action": item.action,
                "outcome": item.outcome,
            }
        )
    _emit({"reconciled": len(done), "dry_run": args.dry_run})
    return 0


def run(args: argparse.Namespace) -> int:
    from token_service.errors import InvalidRequest, NotInProgress, RecordNotFound
    from token_service.ops.admin import audit, shown_ref

    try:
        return int(args.admin_handler(args))
    except _UsageError as exc:
        print(f"token-service admin: {exc}", file=sys.stderr)
        return 2
    except (RecordNotFound, NotInProgress) as exc:
        _emit({"outcome": exc.code, "detail": exc.detail})
        return 1
    except TokenError as exc:
        if isinstance(exc, InvalidRequest):
            # refused before it reached a record: audited too, as over HTTP (never the input itself)
            audit(
                f"cli:{getpass.getuser()}",
                args.admin_command,
                shown_ref(getattr(args, "ref", None)),
                "refused",
                code=exc.code,
                fields=sorted(exc.errors) or None,
            )
        print(f"token-service admin: {exc.code}: {exc.detail}", file=sys.stderr)
        return 1 if exc.status >= 500 or exc.status == 404 else 2


def _count(text: str) -> int:
    number = whole_number(text, max_digits=9)  # not int(): 5000 digits were a traceback
    if number is None or not 1 <= number <= 10000:
        shown = text if len(text) <= 20 else text[:20] + "…"  # a 5000-digit argument is not echoed whole
        raise argparse.ArgumentTypeError(f"{shown!r} is not between 1 and 10000")
    return number


_TAKES_A_REF = ("show", "revoke", "release")
# their options (argparse also takes an unambiguous prefix of one)
_REF_COMMAND_OPTIONS = ("--kind", "--idempotency-key", "--identity", "--count", "--help")


def _is_option(arg: str) -> bool:
    name = arg.split("=", 1)[0]
    return name.startswith("--") and any(option.startswith(name) for option in _REF_COMMAND_OPTIONS)


def dashed_refs_last(argv: Sequence[str]) -> list[str]:
    """``admin show|revoke|release`` with a ref that starts with ``-``: the ref moved behind ``--``.

    A ref is base64url, so one in 64 starts with ``-``, which argparse takes for an
    option ("the following arguments are required: ref"). An argument of a ref's
    shape (``-`` and 5+ base64url characters) that is neither one of the command's
    options nor the value of the option before it goes after ``--``, where argparse
    reads it as the positional it is.
    """
    args = list(argv)
    if len(args) < 3 or args[0] != "admin" or args[1] not in _TAKES_A_REF or "--" in args:
        return args
    kept, refs = args[:2], []
    for arg in args[2:]:
        after_option = kept[-1].startswith("--") and "=" not in kept[-1] and len(kept) > 2
        if _DASHED_REF.fullmatch(arg) and not after_option and not _is_option(arg):
            refs.append(arg)
        else:
            kept.append(arg)
    return [*kept, "--", *refs] if refs else args


def add_parser(commands: Any) -> None:
    """``admin`` and its subcommands, on the ``token-service`` parser's subparsers."""
    admin = commands.add_parser(
        "admin", help="find, show, revoke, release and list records; reconcile stuck operations"
    )
    admin.set_defaults(handler=run)
    actions = admin.add_subparsers(dest="admin_command", required=True)

    def kind_option(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--kind", choices=_KINDS, help="token or idempotency (default: either)")

    show_cmd = actions.add_parser("show", help="one record by its ref (a log line's token_ref), or by key")
    show_cmd.add_argument("ref", nargs="?", help="an access line's token_ref (22 chars; 6+ to search)")
    kind_option(show_cmd)
    show_cmd.add_argument("--idempotency-key", help="an Idempotency-Key, with --identity")
    show_cmd.add_argument("--identity", help="the client identity of the key ('-': read from stdin)")
    show_cmd.add_argument("--count", type=_count, default=1000, help="SCAN COUNT for a short ref")
    show_cmd.set_defaults(admin_handler=show)

    find_cmd = actions.add_parser("find", help="token records whose operation carried this request id")
    find_cmd.add_argument("--request-id", required=True)
    find_cmd.add_argument("--count", type=_count, default=1000, help="SCAN COUNT per step (default 1000)")
    find_cmd.set_defaults(admin_handler=find)

    revoke_cmd = actions.add_parser("revoke", help="delete a record whatever its state")
    revoke_cmd.add_argument("ref")
    kind_option(revoke_cmd)
    revoke_cmd.set_defaults(admin_handler=revoke)

    release_cmd = actions.add_parser("release", help="free a record held by an operation in progress")
    release_cmd.add_argument("ref")
    kind_option(release_cmd)
    release_cmd.set_defaults(admin_handler=release)

    list_cmd = actions.add_parser("list", help="records by state and scope (a bounded SCAN walk)")
    list_cmd.add_argument(
        "--state", choices=("ISSUED", "PROCESSING", "CONSUMED", "SUCCEEDED", "FAILED", "COMPLETED")
    )
    list_cmd.add_argument("--scope")
    kind_option(list_cmd)
    list_cmd.add_argument("--limit", type=_count, default=100, help="records to show (default 100)")
    list_cmd.add_argument("--count", type=_count, default=1000, help="SCAN COUNT per step (default 1000)")
    list_cmd.add_argument("--cursor", default="0", help="go on from the cursor a previous list printed")
    list_cmd.set_defaults(admin_handler=list_records)

    reconcile_cmd = actions.add_parser(
        "reconcile", help="hand PROCESSING records whose lease ran out to a handler (complete/fail/release)"
    )
    reconcile_cmd.add_argument("--handler", dest="decide_with", help="module:function that decides")
    reconcile_cmd.add_argument("--dry-run", action="store_true", help="only list what would be handed over")
    reconcile_cmd.add_argument("--lease-seconds", type=_count, default=60, help="handler time per record")
    reconcile_cmd.add_argument("--db-url", help="the SQL backstop instead of Redis: a SQLAlchemy URL")
    reconcile_cmd.add_argument("--table", default="idempotency_records")
    reconcile_cmd.add_argument("--schema", default=None)
    reconcile_cmd.set_defaults(admin_handler=reconcile)
