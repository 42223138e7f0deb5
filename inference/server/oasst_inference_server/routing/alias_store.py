"""The aliases set through the admin API or CLI, in the database (their truth: the broker only says
that they changed)."""

from __future__ import annotations

from sqlmodel import delete, select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.db.models import DbModelAlias, utcnow
from oasst_shared.model_routes import ModelRoute


async def stored_aliases(session: AsyncSession) -> list[DbModelAlias]:
    return list((await session.exec(select(DbModelAlias).order_by(DbModelAlias.alias))).all())


async def store_alias(session: AsyncSession, alias: str, route: ModelRoute) -> DbModelAlias:
    """Create or replace ``alias`` (committed)."""
    row = await session.get(DbModelAlias, alias)
    if row is None:
        row = DbModelAlias(alias=alias, model_config_name=route.model)
    row.model_config_name = route.model
    row.fallbacks = list(route.fallbacks)
    row.updated_at = utcnow()
    session.add(row)
    await session.commit()
    await session.refresh(row)
    return row


async def remove_alias(session: AsyncSession, alias: str) -> bool:
    """Delete ``alias`` (committed); False if it was not stored."""
    result = await session.exec(delete(DbModelAlias).where(DbModelAlias.alias == alias))
    await session.commit()
    return bool(result.rowcount)
