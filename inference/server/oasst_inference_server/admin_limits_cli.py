"""``oasst-server admin keys|set-key-limits|set-user-limits|usage``: usage limits from the command line,
on the database of the server's settings (as the admin API: ``api/routes/admin_limits.py``). Output is JSON
on standard output, in the admin API's shapes.

    keys [--user-id ID]                              API keys with their limits and usage
    set-key-limits KEY_ID [limit options]            replace a key's limits (no option: none)
    set-user-limits USER_ID [limit options]          replace a user's limits
    usage [--key-id] [--user-id] [--model] [--since] [--until]   usage per day, key and model

Limit options: --requests-per-minute N, --tokens-per-minute N, --budget-tokens N, --budget-usd X,
--budget-period day|month, --allowed-models a,b (an empty string: no model).
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter, ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine

from oasst_inference_server.db.engine import make_session_factory
from oasst_inference_server.domain_errors import DomainError
from oasst_inference_server.quotas.admin_views import list_keys, set_key_limits, set_user_limits, usage_report
from oasst_inference_server.quotas.prices import Prices
from oasst_inference_server.settings import Settings
from oasst_shared.model_registry import load_registry
from oasst_shared.usage_limits import UsageLimits, UsageRow

COMMANDS = ("keys", "set-key-limits", "set-user-limits", "usage")


def _limit_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests-per-minute", type=int)
    parser.add_argument("--tokens-per-minute", type=int)
    parser.add_argument("--budget-tokens", type=int)
    parser.add_argument("--budget-usd", type=float)
    parser.add_argument("--budget-period", choices=("day", "month"))
    parser.add_argument("--allowed-models", help="comma-separated model config names")


def add_commands(commands: Any) -> None:
    """Add this module's subcommands to the admin CLI's subparsers."""
    keys = commands.add_parser("keys", help="list API keys with their limits and usage (JSON)")
    keys.add_argument("--user-id")
    key_limits = commands.add_parser("set-key-limits", help="replace an API key's usage limits")
    key_limits.add_argument("key_id")
    _limit_options(key_limits)
    user_limits = commands.add_parser("set-user-limits", help="replace a user's usage limits")
    user_limits.add_argument("user_id")
    _limit_options(user_limits)
    usage = commands.add_parser("usage", help="usage per day, key and model (JSON)")
    usage.add_argument("--key-id")
    usage.add_argument("--user-id")
    usage.add_argument("--model")
    usage.add_argument("--since", type=datetime.fromisoformat, help="ISO date or time (UTC)")
    usage.add_argument("--until", type=datetime.fromisoformat, help="ISO date or time (UTC)")


def limits_of(args: argparse.Namespace) -> UsageLimits:
    """The limits the options give; SystemExit naming the bad value."""
    allowed = None
    if args.allowed_models is not None:
        allowed = [m.strip() for m in args.allowed_models.split(",") if m.strip()]
    try:
        return UsageLimits(
            requests_per_minute=args.requests_per_minute,
            tokens_per_minute=args.tokens_per_minute,
            budget_tokens=args.budget_tokens,
            budget_usd=args.budget_usd,
            budget_period=args.budget_period,
            allowed_models=allowed,
        )
    except ValidationError as exc:
        raise SystemExit(f"invalid limits: {exc.errors(include_url=False)[0]['msg']}") from None


async def run(args: argparse.Namespace, engine: AsyncEngine, settings: Settings) -> str:
    """Run one of :data:`COMMANDS`; its JSON output."""
    prices = Prices(load_registry(settings.model_configs_dir))
    try:
        async with make_session_factory(engine)() as session:
            if args.command == "keys":
                keys = await list_keys(session, prices, user_id=args.user_id)
                return json.dumps([k.model_dump(mode="json") for k in keys], indent=2)
            if args.command == "set-key-limits":
                key = await set_key_limits(session, prices, args.key_id, limits_of(args))
                return key.model_dump_json(indent=2)
            if args.command == "set-user-limits":
                read = await set_user_limits(session, args.user_id, limits_of(args))
                return read.model_dump_json(indent=2)
            rows = await usage_report(
                session,
                prices,
                key_id=args.key_id,
                user_id=args.user_id,
                model=args.model,
                since=args.since,
                until=args.until,
            )
            return TypeAdapter(list[UsageRow]).dump_json(rows, indent=2).decode()
    except DomainError as exc:
        raise SystemExit(f"{exc.code}: {exc.detail}") from None
