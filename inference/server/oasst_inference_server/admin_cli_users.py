"""``oasst-server admin set-admin``: make a user an admin user (or not), found by id or sign-in identity.

The user must have signed in once (the row exists); ``settings.admin_users`` makes admins of identities
that have not signed in yet.
"""

from __future__ import annotations

import argparse
import re
import sys

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlmodel import select

from oasst_inference_server.auth.admin_users import change_user_admin, sign_in_identity
from oasst_inference_server.db.engine import make_session_factory
from oasst_inference_server.db.models import DbUser


def _user_id(value: str) -> str:
    if not re.fullmatch(r"[0-9a-f-]{1,36}", value):
        raise argparse.ArgumentTypeError(f"not a user id: {value!r}")
    return value


def _identity(value: str) -> str:
    # As settings.admin_users spells them.
    if not re.fullmatch(r"[a-z]{1,32}:\S{1,128}", value):
        raise argparse.ArgumentTypeError(f"not PROVIDER:ACCOUNT_ID: {value!r}")
    return value


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("set-admin", help="make a user an admin user (or not, with --off)")
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument(
        "--user-id", type=_user_id, help="the user's id (as GET /account or GET /admin/users/{id} show it)"
    )
    who.add_argument(
        "--identity", type=_identity, help="the user's sign-in PROVIDER:ACCOUNT_ID, e.g. github:1234567"
    )
    parser.add_argument("--off", action="store_true", help="take the admin flag away")


async def set_admin(engine: AsyncEngine, args: argparse.Namespace) -> None:
    async with make_session_factory(engine)() as session:
        if args.user_id is not None:
            user = await session.get(DbUser, args.user_id)
        else:
            provider, _, account = args.identity.partition(":")
            query = select(DbUser).where(DbUser.provider == provider, DbUser.provider_account_id == account)
            user = (await session.exec(query)).one_or_none()
        if user is None or user.deleted:
            raise SystemExit(f"no such user: {args.user_id or args.identity} (has it signed in once?)")
        await change_user_admin(session, user, not args.off)
        state = "not an admin user" if args.off else "an admin user"
        print(
            f"user {user.display_name!r} ({sign_in_identity(user)}, id {user.id}) is {state}", file=sys.stderr
        )
