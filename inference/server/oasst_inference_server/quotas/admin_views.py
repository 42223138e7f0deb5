"""What the admin API and CLI show and change: keys with their limits and usage, users' limits, usage rows
per key, model and day."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.db.models import DbApiKey, DbUser, utcnow
from oasst_inference_server.domain_errors import InvalidValue, not_found
from oasst_inference_server.quotas import periods
from oasst_inference_server.quotas.limits_store import limits_by_subject, set_limits
from oasst_inference_server.quotas.prices import MICRO, Prices
from oasst_inference_server.quotas.usage_rows import DayUsage, UsageFilter, usage_by_day
from oasst_shared.usage_limits import AdminKeyRead, KeyUsageSummary, UsageLimits, UsageRow, UserLimitsRead

MAX_KEYS_LISTED = 5000
MAX_USAGE_DAYS = 366
DEFAULT_USAGE_DAYS = 30


def _summary(rows: list[DayUsage], limits: UsageLimits, prices: Prices, now: datetime) -> KeyUsageSummary:
    today = now.date()
    period = limits.budget_period or "month"
    start = periods.period_start(period, now).date()
    in_period = [r for r in rows if r.day >= start]
    micro = sum(prices.micro_usd(r.model, r.prompt_tokens, r.completion_tokens) for r in in_period)
    todays = [r for r in rows if r.day == today]
    return KeyUsageSummary(
        requests_today=sum(r.requests for r in todays),
        tokens_today=sum(r.tokens for r in todays),
        spent_usd_period=micro / MICRO,
    )


async def list_keys(
    session: AsyncSession, prices: Prices, *, user_id: str | None = None, limit: int = MAX_KEYS_LISTED
) -> list[AdminKeyRead]:
    """Every API key (or ``user_id``'s), newest first, with its limits and usage."""
    query = select(DbApiKey).order_by(DbApiKey.created_at.desc()).limit(limit)
    if user_id is not None:
        query = query.where(DbApiKey.user_id == user_id)
    keys = list((await session.exec(query)).all())
    limits = await limits_by_subject(session, "key", [k.id for k in keys])
    now = utcnow()
    since = periods.period_start("month", now)  # today is in it
    by_key: dict[str, list[DayUsage]] = {}
    if keys:
        for row in await usage_by_day(session, UsageFilter(since=since, user_id=user_id)):
            if row.key_id is not None:
                by_key.setdefault(row.key_id, []).append(row)
    return [_key_read(k, limits.get(k.id, UsageLimits()), by_key.get(k.id, []), prices, now) for k in keys]


def _key_read(
    key: DbApiKey, limits: UsageLimits, rows: list[DayUsage], prices: Prices, now: datetime
) -> AdminKeyRead:
    """The key with its limits and the usage ``rows`` (its own, since the month began) sum up to."""
    return AdminKeyRead(
        id=key.id,
        user_id=key.user_id,
        name=key.name,
        prefix=key.prefix,
        revoked_at=key.revoked_at,
        limits=limits,
        usage=_summary(rows, limits, prices, now),
    )


async def set_key_limits(
    session: AsyncSession, prices: Prices, key_id: str, limits: UsageLimits
) -> AdminKeyRead:
    key = await session.get(DbApiKey, key_id)
    if key is None:
        raise not_found("api_key")
    await set_limits(session, "key", key_id, limits)
    now = utcnow()
    rows = await usage_by_day(session, UsageFilter(since=periods.period_start("month", now), key_id=key_id))
    return _key_read(key, limits, rows, prices, now)


async def user_limits(session: AsyncSession, user_id: str) -> UserLimitsRead:
    if await session.get(DbUser, user_id) is None:
        raise not_found("user")
    found = await limits_by_subject(session, "user", [user_id])
    return UserLimitsRead(user_id=user_id, limits=found.get(user_id, UsageLimits()))


async def set_user_limits(session: AsyncSession, user_id: str, limits: UsageLimits) -> UserLimitsRead:
    if await session.get(DbUser, user_id) is None:
        raise not_found("user")
    await set_limits(session, "user", user_id, limits)
    return UserLimitsRead(user_id=user_id, limits=limits)


def usage_window(since: datetime | None, until: datetime | None) -> tuple[datetime, datetime]:
    """The asked window (default: the last 30 days), at most a year long (``InvalidValue`` otherwise)."""
    until = until or utcnow()
    since = since or until - timedelta(days=DEFAULT_USAGE_DAYS)
    if since.tzinfo is None:
        since = since.replace(tzinfo=until.tzinfo)
    if until.tzinfo is None:
        until = until.replace(tzinfo=since.tzinfo)
    if since >= until:
        raise InvalidValue("invalid_window", "since must be before until")
    if until - since > timedelta(days=MAX_USAGE_DAYS):
        raise InvalidValue("window_too_long", f"at most {MAX_USAGE_DAYS} days of usage at once")
    return since, until


async def usage_report(
    session: AsyncSession,
    prices: Prices,
    *,
    key_id: str | None = None,
    user_id: str | None = None,
    model: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[UsageRow]:
    start, end = usage_window(since, until)
    rows = await usage_by_day(
        session, UsageFilter(since=start, until=end, key_id=key_id, user_id=user_id, model=model)
    )
    return [
        UsageRow(
            day=r.day,
            user_id=r.user_id,
            key_id=r.key_id,
            model=r.model,
            requests=r.requests,
            prompt_tokens=r.prompt_tokens,
            completion_tokens=r.completion_tokens,
            cost_usd=prices.usd(r.model, r.prompt_tokens, r.completion_tokens),
        )
        for r in rows
    ]
