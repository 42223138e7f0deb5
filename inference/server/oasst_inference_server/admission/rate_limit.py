"""Per-user limits on generations: so many per minute, so many at once.

Both are counted in the database (messages enqueued by the user in the last minute; the user's pending
and in-progress messages), so they hold across any number of replicas with no extra state. A request
counts what it will start: a ``/v1`` request with ``n`` choices is ``n`` generations, admitted or refused
whole. Two requests racing past the check together would both get in, so one user's submissions are
admitted one at a time, each from its check to the commit of its messages: on Postgres the check locks
the user's row until that commit (other users never wait on that lock); SQLite has no row locks, so
there the submission holds the user's turn in the one server process (:mod:`.user_turns`).

A generation is any message that was queued for a worker (``enqueued_at`` set): a chat's assistant
message, an OpenAI-API completion or an embedding request. Chat messages carry no ``user_id``; they
belong to the user through their chat. Generations whose messages were deleted (with a chat or an
account) still count, through their usage records.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from sqlalchemy import and_, literal, or_, union_all
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession
from sqlmodel.sql.expression import Select

from oasst_inference_server.chats.usage_records import identity_subject
from oasst_inference_server.db.models import DbChat, DbMessage, DbUsageRecord, DbUser, utcnow
from oasst_inference_server.dispatch.message_lifecycle import ACTIVE_STATES
from oasst_inference_server.domain_errors import InvalidRequest, RateLimited
from oasst_inference_server.settings import Settings

WINDOW = timedelta(minutes=1)
_CONCURRENCY_RETRY_AFTER = 2  # seconds: a generation slot frees when any of the user's answers ends


async def _identity(session: AsyncSession, user_id: str, lock: bool = True) -> str | None:
    """The user's sign-in identity hash (``usage_records.subject_of``), reading the user's row; on
    Postgres the row stays locked for the rest of the transaction (``FOR NO KEY UPDATE``: inserts that
    reference the user, such as a new chat, do not wait for it). None if there is no such user."""
    query = select(DbUser.provider, DbUser.provider_account_id).where(DbUser.id == user_id)
    if lock and session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update(key_share=True)
    row = (await session.exec(query)).first()
    return identity_subject(row[0], row[1]) if row is not None else None


def _generations(
    user_id: str, subject: str | None, *, active: bool, since: datetime | None
) -> Select[datetime | None, bool]:
    """One query for both limits: rows ``(enqueued_at, running)`` of the user's generations that are
    running (if ``active``) or were enqueued at or after ``since`` (if given): API requests, chat
    answers, and the usage records of deleted ones (never running)."""
    running = (DbMessage.state.in_(ACTIVE_STATES) if active else literal(False)).label("running")
    wanted = [DbMessage.state.in_(ACTIVE_STATES)] if active else []
    if since is not None:
        wanted.append(and_(DbMessage.enqueued_at.is_not(None), DbMessage.enqueued_at >= since))
    direct = select(DbMessage.enqueued_at, running).where(DbMessage.user_id == user_id, or_(*wanted))
    via_chat = (
        select(DbMessage.enqueued_at, running)
        .join(DbChat, DbChat.id == DbMessage.chat_id)
        .where(DbChat.user_id == user_id, DbMessage.user_id.is_(None), or_(*wanted))
    )
    parts = [direct, via_chat]
    if since is not None:
        # Generations of deleted messages: the user's own, and those of earlier accounts of the same
        # sign-in identity (``usage_records.py``).
        owner = DbUsageRecord.user_id == user_id
        if subject is not None:
            owner = or_(owner, DbUsageRecord.subject == subject)
        parts.append(
            select(DbUsageRecord.enqueued_at, literal(False).label("running")).where(
                owner, DbUsageRecord.enqueued_at >= since
            )
        )
    rows = union_all(*parts).subquery()
    return select(rows.c.enqueued_at, rows.c.running)


async def check_generation_limits(
    session: AsyncSession, settings: Settings, user_id: str, count: int = 1, *, lock: bool = True
) -> None:
    """Raise ``RateLimited`` (with ``retry_after``) if the user may not start ``count`` more generations
    now, ``InvalidRequest`` if ``count`` alone is over a limit (no wait would let it in). Two round
    trips: the user's row (locked on Postgres until ``session`` commits or rolls back: call this in the
    transaction that inserts the generations, just before it), then one query for both limits.
    ``lock`` false: a look ahead of admission (no row lock; admission checks again)."""
    running_limit = settings.max_concurrent_generations_per_user
    limit = settings.rate_limit_per_minute
    if not running_limit and not limit:
        return
    _check_request_size(count, running_limit, limit)
    subject = await _identity(session, user_id, lock)
    now = utcnow()
    query = _generations(user_id, subject, active=bool(running_limit), since=now - WINDOW if limit else None)
    rows = (await session.exec(query)).all()
    if running_limit:
        running = sum(1 for _, is_running in rows if is_running)
        if running + count > running_limit:
            asked = "one more" if count == 1 else f"{count} more"
            raise RateLimited(
                "too_many_concurrent_generations",
                f"{running} of your generations are still running and this request starts {asked} "
                f"(the limit is {running_limit}): wait for one to finish",
                retry_after=_CONCURRENCY_RETRY_AFTER,
            )
    if limit:
        since = now - WINDOW
        recent = sorted(t for t, _ in rows if t is not None and t >= since)
        if len(recent) + count > limit:
            # Once the oldest requests leave the window, ``count`` more fit: the one whose departure
            # makes room for the last of them says when.
            frees_at = recent[len(recent) + count - limit - 1] + WINDOW
            retry_after = max(1, math.ceil((frees_at - now).total_seconds()))
            starts = f", and this request starts {count}" if count > 1 else ""
            raise RateLimited(
                "rate_limited",
                f"rate limit reached: {limit} generations per minute{starts}; retry in {retry_after}s",
                retry_after=retry_after,
            )


def _check_request_size(count: int, running_limit: int, limit: int) -> None:
    """A request that starts more generations than a limit allows at all is refused as it is (400): a
    429 would tell its client to retry what can never pass."""
    for bound, what in ((running_limit, "at once"), (limit, "per minute")):
        if bound and count > bound:
            raise InvalidRequest(
                "too_many_choices",
                f"the request starts {count} generations; this server allows {bound} {what} per user",
                param="n",
            )
