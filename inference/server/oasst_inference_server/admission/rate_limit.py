"""Per-user limits on generations: so many per minute, so many at once.

Both are counted in the database (messages enqueued by the user in the last minute; the user's pending
and in-progress messages), so they hold across any number of replicas with no extra state. Two requests
racing past the check together would both get in, so on Postgres the check first locks the user's row
until the transaction that inserts the new message commits: one user's submissions are admitted one at a
time, and a burst of simultaneous requests cannot push past the limits (other users never wait on that
lock). SQLite (the single-process development default) has no row locks; there two racing requests may
both get in.

A generation is any message that was queued for a worker (``enqueued_at`` set): a chat's assistant
message, an OpenAI-API completion or an embedding request. Chat messages carry no ``user_id``; they
belong to the user through their chat. Generations whose messages were deleted (with a chat or an
account) still count, through their usage records.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, func, or_
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession
from sqlmodel.sql.expression import SelectOfScalar

from oasst_inference_server.chats.usage_records import subject_of
from oasst_inference_server.db.models import DbChat, DbMessage, DbUsageRecord, DbUser, utcnow
from oasst_inference_server.dispatch.message_lifecycle import ACTIVE_STATES
from oasst_inference_server.domain_errors import RateLimited
from oasst_inference_server.settings import Settings

WINDOW = timedelta(minutes=1)
_CONCURRENCY_RETRY_AFTER = 2  # seconds: a generation slot frees when any of the user's answers ends


def _own_generations(user_id: str, condition: ColumnElement[bool]) -> list[SelectOfScalar[datetime | None]]:
    """Two selects of the user's generations matching ``condition``: API requests and chat answers."""
    direct = select(DbMessage.enqueued_at).where(DbMessage.user_id == user_id, condition)
    via_chat = (
        select(DbMessage.enqueued_at)
        .join(DbChat, DbChat.id == DbMessage.chat_id)
        .where(DbChat.user_id == user_id, DbMessage.user_id.is_(None), condition)
    )
    return [direct, via_chat]


async def _count(session: AsyncSession, user_id: str, condition: ColumnElement[bool]) -> int:
    total = 0
    for query in _own_generations(user_id, condition):
        total += int((await session.exec(select(func.count()).select_from(query.subquery()))).one())
    return total


async def _recorded_since(session: AsyncSession, user_id: str, since: datetime) -> list[datetime]:
    """Generations of deleted messages: the user's own, and those of earlier accounts of the same
    sign-in identity (``usage_records.py``)."""
    user = await session.get(DbUser, user_id)
    owner = DbUsageRecord.user_id == user_id
    if user is not None:
        owner = or_(owner, DbUsageRecord.subject == subject_of(user))
    rows = await session.exec(
        select(DbUsageRecord.enqueued_at).where(owner, DbUsageRecord.enqueued_at >= since)
    )
    return list(rows.all())


async def _admit_one_at_a_time(session: AsyncSession, user_id: str) -> None:
    """Lock the user's row for the rest of the transaction (Postgres; a no-op on SQLite). ``FOR NO KEY
    UPDATE``: inserts that reference the user (a new chat) do not wait for it."""
    if session.get_bind().dialect.name != "postgresql":
        return
    await session.exec(select(DbUser.id).where(DbUser.id == user_id).with_for_update(key_share=True))


async def check_generation_limits(session: AsyncSession, settings: Settings, user_id: str) -> None:
    """Raise ``RateLimited`` (with ``retry_after``) if the user may not start another generation now.
    On Postgres the user's row stays locked until ``session`` commits or rolls back: call this in the
    transaction that inserts the generation, just before it."""
    if settings.max_concurrent_generations_per_user or settings.rate_limit_per_minute:
        await _admit_one_at_a_time(session, user_id)
    if settings.max_concurrent_generations_per_user:
        active = DbMessage.state.in_(ACTIVE_STATES)
        running = await _count(session, user_id, active)
        if running >= settings.max_concurrent_generations_per_user:
            raise RateLimited(
                "too_many_concurrent_generations",
                f"{running} of your generations are still running (the limit is "
                f"{settings.max_concurrent_generations_per_user}): wait for one to finish",
                retry_after=_CONCURRENCY_RETRY_AFTER,
            )
    limit = settings.rate_limit_per_minute
    if limit:
        now = utcnow()
        recent_condition = and_(
            DbMessage.enqueued_at.is_not(None),
            DbMessage.enqueued_at >= now - WINDOW,
        )
        recent: list[datetime] = []
        for query in _own_generations(user_id, recent_condition):
            recent.extend(t for t in (await session.exec(query)).all() if t is not None)
        recent.extend(await _recorded_since(session, user_id, now - WINDOW))
        if len(recent) >= limit:
            recent.sort()
            # Once the oldest requests leave the window, one more fits.
            frees_at = recent[len(recent) - limit] + WINDOW
            retry_after = max(1, math.ceil((frees_at - now).total_seconds()))
            raise RateLimited(
                "rate_limited",
                f"rate limit reached: {limit} generations per minute; retry in {retry_after}s",
                retry_after=retry_after,
            )
