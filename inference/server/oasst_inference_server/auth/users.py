"""Users as sign-in finds them: one row per (provider, account id), created on first sign-in."""

from __future__ import annotations

from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.db.models import DbUser
from oasst_inference_server.domain_errors import not_found


async def get_or_create_user(session: AsyncSession, provider: str, account_id: str, name: str) -> DbUser:
    """The user signed in as ``account_id`` at ``provider``; a new one (committed) named ``name`` if none."""
    user = (
        await session.exec(
            select(DbUser).where(DbUser.provider == provider, DbUser.provider_account_id == account_id)
        )
    ).one_or_none()
    if user is None:
        user = DbUser(provider=provider, provider_account_id=account_id, display_name=name)
        session.add(user)
        await session.commit()
    return user


async def find_user(session: AsyncSession, user_id: str, *, deleted_too: bool = True) -> DbUser:
    """The user ``user_id`` (``not_found`` if there is none, or if it is deleted and not ``deleted_too``)."""
    user = await session.get(DbUser, user_id)
    if user is None or (user.deleted and not deleted_too):
        raise not_found("user")
    return user


async def change_user_tier(session: AsyncSession, user: DbUser, tier: str | None) -> None:
    """Set the user's tier (committed)."""
    user.tier = tier
    session.add(user)
    await session.commit()
