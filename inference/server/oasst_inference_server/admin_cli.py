"""``oasst-server admin ...``: the operator's first-run commands, run where the server's settings are.

They talk to the database directly (the settings of ``OASST_SERVER_*``, as in the server's container:
``docker compose exec server oasst-server admin create-worker-key --name gpu-1``), bring it to the
newest migration first, and print the created key alone on standard output, so that a script can
capture it; what was done goes to standard error. Keys are shown once and stored as hashes.

    create-worker-key --name NAME         a worker's API key (as POST /admin/workers)
    create-api-key --user NAME [--name]   an API key of user NAME, created if missing (provider
                                          ``local``): for the text-client and the OpenAI API
    set-admin (--user-id ID | --identity PROVIDER:ACCOUNT_ID) [--off]
                                          make a user an admin user, or not (admin_cli_users.py)
    migrate                               bring the database to the newest migration and exit
    export [--output FILE] [--gzip] ...   the chats that allow data use as Open-Assistant message
                                          trees, one per line (docs/operating.md#exporting-the-conversations-dataset-export)
    keys, set-key-limits, set-user-limits, usage
                                          usage limits of API keys and users (``admin_limits_cli``)
    set-alias, delete-alias, list-aliases model aliases (``alias_cli``)
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from collections.abc import Sequence

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from oasst_inference_server import admin_cli_users, admin_limits_cli, alias_cli
from oasst_inference_server.auth.api_key_store import create_api_key
from oasst_inference_server.auth.worker_keys import new_worker_key
from oasst_inference_server.chats.export import command as export_command
from oasst_inference_server.db.engine import create_engine, make_session_factory
from oasst_inference_server.db.migrations import upgrade_to_head
from oasst_inference_server.db.models import DbUser, DbWorker
from oasst_inference_server.logging_setup import configure_logging
from oasst_inference_server.settings import Settings

# Users made here sign in with their API keys only; the provider keeps them apart from OAuth accounts.
LOCAL_PROVIDER = "local"
_NAME = r"^[A-Za-z0-9_.@-]{1,64}$"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="oasst-server admin",
        description="Operator commands. They use the database of the OASST_SERVER_* settings.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    worker = commands.add_parser("create-worker-key", help="register a worker and print its API key")
    worker.add_argument("--name", required=True, help="the worker's name in listings (1-64 characters)")
    api_key = commands.add_parser("create-api-key", help="print a new API key of a user (created if missing)")
    api_key.add_argument("--user", required=True, help="user name (letters, digits, _ . @ -; up to 64)")
    api_key.add_argument("--name", default="cli", help="the key's name in the user's key list")
    admin_cli_users.add_parser(commands)
    commands.add_parser("migrate", help="bring the database to the newest migration")
    export_command.add_parser(commands)
    admin_limits_cli.add_commands(commands)
    alias_cli.add_commands(commands)
    return parser


async def _create_worker_key(engine: AsyncEngine, name: str) -> str:
    key, key_hash, prefix = new_worker_key()
    async with make_session_factory(engine)() as session:
        worker = DbWorker(name=name, api_key_hash=key_hash, api_key_prefix=prefix)
        session.add(worker)
        await session.commit()
        print(f"worker {name!r} registered (id {worker.id}, key prefix {prefix})", file=sys.stderr)
    return key


async def _create_api_key(engine: AsyncEngine, username: str, key_name: str) -> str:
    async with make_session_factory(engine)() as session:
        user = (
            await session.exec(
                select(DbUser).where(
                    DbUser.provider == LOCAL_PROVIDER, DbUser.provider_account_id == username
                )
            )
        ).scalar_one_or_none()
        if user is None:
            user = DbUser(provider=LOCAL_PROVIDER, provider_account_id=username, display_name=username)
            session.add(user)
            await session.commit()
            print(f"user {username!r} created (id {user.id})", file=sys.stderr)
        elif user.deleted:
            raise SystemExit(f"user {username!r} was deleted")
        row, key = await create_api_key(session, user, key_name)
        print(f"API key {row.name!r} of {username!r} created (prefix {row.prefix})", file=sys.stderr)
    return key


async def _run(args: argparse.Namespace, settings: Settings) -> str | None:
    engine = create_engine(settings)
    try:
        await upgrade_to_head(engine, startup_timeout=settings.database_startup_timeout)
        if args.command == "create-worker-key":
            return await _create_worker_key(engine, args.name)
        if args.command == "create-api-key":
            return await _create_api_key(engine, args.user, args.name)
        if args.command == export_command.COMMAND:
            await export_command.run(engine, args)
            return None
        if args.command in admin_limits_cli.COMMANDS:
            return await admin_limits_cli.run(args, engine, settings)
        if args.command == "set-admin":
            await admin_cli_users.set_admin(engine, args)
            return None
        if args.command in alias_cli.COMMANDS:
            return await alias_cli.run(args, settings, engine)
        print("the database is at the newest migration", file=sys.stderr)
        return None
    finally:
        await engine.dispose()


def main(argv: Sequence[str] | None = None, settings: Settings | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == export_command.COMMAND and (problem := export_command.usage_error(args)):
        parser.error(problem)
    for value, flag in ((getattr(args, "name", None), "--name"), (getattr(args, "user", None), "--user")):
        if value is not None and not re.fullmatch(_NAME, value):
            parser.error(f"{flag}: 1-64 letters, digits or _ . @ - (got {value!r})")
    if settings is None:
        try:
            settings = Settings()
        except ValidationError as exc:
            print(f"oasst-server admin: the server settings are invalid:\n{exc}", file=sys.stderr)
            return 2
    # Migration progress would drown the key: warnings and errors only.
    configure_logging("WARNING")
    output = asyncio.run(_run(args, settings))
    if output is not None:
        print(output)
    return 0
