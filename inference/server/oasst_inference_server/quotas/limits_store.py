"""The limits an admin set on keys and users, in the ``usage_limit`` table."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import and_, or_
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.db.models import DbUsageLimit, utcnow
from oasst_inference_server.quotas.periods import SubjectKind
from oasst_shared.usage_limits import UsageLimits

_FIELDS = tuple(UsageLimits.model_fields)


def as_limits(row: DbUsageLimit | None) -> UsageLimits:
    if row is None:
        return UsageLimits()
    return UsageLimits.model_validate({name: getattr(row, name) for name in _FIELDS})


async def limits_of(
    session: AsyncSession, user_id: str, api_key_id: str | None
) -> tuple[UsageLimits | None, UsageLimits | None]:
    """The limits of the key (None without a key or limits) and of the user (None without), one query."""
    wanted = [and_(DbUsageLimit.subject_kind == "user", DbUsageLimit.subject_id == user_id)]
    if api_key_id is not None:
        wanted.append(and_(DbUsageLimit.subject_kind == "key", DbUsageLimit.subject_id == api_key_id))
    rows = (await session.exec(select(DbUsageLimit).where(or_(*wanted)))).all()
    by_kind = {row.subject_kind: as_limits(row) for row in rows}
    return by_kind.get("key"), by_kind.get("user")


async def limits_by_subject(
    session: AsyncSession, kind: SubjectKind, ids: Sequence[str]
) -> dict[str, UsageLimits]:
    if not ids:
        return {}
    rows = (
        await session.exec(
            select(DbUsageLimit).where(DbUsageLimit.subject_kind == kind, DbUsageLimit.subject_id.in_(ids))
        )
    ).all()
    return {row.subject_id: as_limits(row) for row in rows}


async def set_limits(session: AsyncSession, kind: SubjectKind, subject_id: str, limits: UsageLimits) -> None:
    """Replace the subject's limits (no limits at all: the row goes) and commit."""
    row = await session.get(DbUsageLimit, (kind, subject_id))
    if limits.is_empty:
        if row is not None:
            await session.delete(row)
    else:
        if row is None:
            row = DbUsageLimit(subject_kind=kind, subject_id=subject_id)
        for name in _FIELDS:
            setattr(row, name, getattr(limits, name))
        row.updated_at = utcnow()
        session.add(row)
    await session.commit()
