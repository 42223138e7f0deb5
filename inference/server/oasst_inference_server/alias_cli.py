"""``oasst-server admin`` commands of model aliases (dispatched by ``admin_cli``), with the checks of the
admin API (``routing.alias_admin``)::

    set-alias ALIAS MODEL [--fallback NAME]...   point ALIAS at the model config MODEL
    delete-alias ALIAS                           remove an alias set here or through the API
    list-aliases                                 every alias and the files' fallbacks, as JSON

They write the database of the ``OASST_SERVER_*`` settings, then tell the replicas through their broker
(``broker_url``), so the change acts at once. With the in-process broker (no ``broker_url``: the embedded
mode) the server reads it within ``alias_cache_seconds``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from oasst_inference_server.broker import create_broker
from oasst_inference_server.db.engine import make_session_factory
from oasst_inference_server.domain_errors import DomainError
from oasst_inference_server.routing.alias_admin import AliasAdmin
from oasst_inference_server.scheduling.worker_registry import WorkerRegistry
from oasst_inference_server.settings import Settings
from oasst_shared.model_registry import load_registry
from oasst_shared.model_routes import ModelRoute

COMMANDS = ("set-alias", "delete-alias", "list-aliases")


def add_commands(commands: Any) -> None:
    """Add the alias commands to the admin CLI's subcommands (an ``argparse`` subparsers object)."""
    set_alias = commands.add_parser(
        "set-alias", help="point an alias at a model config (created or replaced)"
    )
    set_alias.add_argument("alias", help="the alias (1-64 letters, digits or _ . : @ + -)")
    set_alias.add_argument("model", help="the model config it stands for")
    set_alias.add_argument(
        "--fallback",
        action="append",
        default=[],
        metavar="NAME",
        help="a model config that serves when the model cannot (repeat, in order)",
    )
    delete = commands.add_parser("delete-alias", help="remove an alias set with set-alias or the admin API")
    delete.add_argument("alias")
    commands.add_parser("list-aliases", help="print every alias and the files' fallbacks as JSON")


async def run(args: argparse.Namespace, settings: Settings, engine: AsyncEngine) -> str | None:
    """Run one alias command; its output (JSON), or None. A refused change exits with status 1."""
    broker = create_broker(settings.broker_url, key_prefix=settings.redis_key_prefix)
    await broker.start()
    try:
        configs = load_registry(settings.model_configs_dir)
        # The configs connected workers announce count too (with the in-process broker: none).
        fleet = WorkerRegistry(broker, known=configs, on_demand=settings.on_demand_loading).fleet_configs
        admin = AliasAdmin(make_session_factory(engine), broker, configs, fleet=fleet)
        try:
            if args.command == "set-alias":
                read = await admin.set(args.alias, _route(args.model, args.fallback))
                print(f"alias {read.alias!r} -> {read.model!r} {read.fallbacks}", file=sys.stderr)
                return read.model_dump_json(indent=2)
            if args.command == "delete-alias":
                await admin.delete(args.alias)
                print(f"alias {args.alias!r} removed", file=sys.stderr)
                return None
            return (await admin.list()).model_dump_json(indent=2)
        except DomainError as exc:
            raise SystemExit(f"oasst-server admin: {exc.code}: {exc.detail}") from None
    finally:
        await broker.close()


def _route(model: str, fallbacks: list[str]) -> ModelRoute:
    try:
        return ModelRoute(model=model, fallbacks=fallbacks)
    except ValueError as exc:
        raise SystemExit(f"oasst-server admin: {exc}") from None
