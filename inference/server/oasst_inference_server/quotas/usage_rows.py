"""Usage per key, model and day (UTC), counted in the database: the generations' own messages plus the
usage records of deleted ones (``chats.usage_records``). What the admin API reports, and what rebuilds a
budget counter the broker lost."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from sqlalchemy import Date, cast, func, select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.db.models import DbChat, DbMessage, DbUsageRecord
from oasst_inference_server.quotas.periods import SubjectKind
from oasst_inference_server.quotas.prices import Prices


@dataclass(frozen=True)
class UsageFilter:
    since: datetime
    until: datetime | None = None
    key_id: str | None = None
    user_id: str | None = None
    model: str | None = None


@dataclass
class DayUsage:
    day: date
    user_id: str | None
    key_id: str | None
    model: str | None
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def _day(session: AsyncSession, column: Any) -> Any:
    if session.get_bind().dialect.name == "postgresql":
        return cast(func.timezone("UTC", column), Date)
    return func.date(column)  # SQLite keeps UTC text


def _as_date(value: Any) -> date:
    return value if isinstance(value, date) else date.fromisoformat(str(value)[:10])


async def usage_by_day(session: AsyncSession, wanted: UsageFilter) -> list[DayUsage]:
    """Rows per day, user, key and model, oldest day first."""
    user = func.coalesce(DbMessage.user_id, DbChat.user_id)
    day = _day(session, DbMessage.enqueued_at)
    # sqlalchemy's select: sqlmodel's types at most four columns.
    live: Any = (
        select(
            day,
            user,
            DbMessage.api_key_id,
            DbMessage.model_config_name,
            func.count(),
            func.sum(func.coalesce(DbMessage.prompt_tokens, 0)),
            func.sum(func.coalesce(DbMessage.generated_tokens, 0)),
        )
        .select_from(DbMessage)
        .outerjoin(DbChat, DbChat.id == DbMessage.chat_id)
        .where(DbMessage.enqueued_at.is_not(None), DbMessage.enqueued_at >= wanted.since)
        .group_by(day, user, DbMessage.api_key_id, DbMessage.model_config_name)
    )
    if wanted.until is not None:
        live = live.where(DbMessage.enqueued_at < wanted.until)
    if wanted.key_id is not None:
        live = live.where(DbMessage.api_key_id == wanted.key_id)
    if wanted.user_id is not None:
        live = live.where(user == wanted.user_id)
    if wanted.model is not None:
        live = live.where(DbMessage.model_config_name == wanted.model)
    record_day = _day(session, DbUsageRecord.enqueued_at)
    recorded: Any = (
        select(
            record_day,
            DbUsageRecord.user_id,
            DbUsageRecord.api_key_id,
            DbUsageRecord.model_config_name,
            func.count(),
            func.sum(DbUsageRecord.prompt_tokens),
            func.sum(DbUsageRecord.generated_tokens),
        )
        .where(DbUsageRecord.enqueued_at >= wanted.since)
        .group_by(
            record_day, DbUsageRecord.user_id, DbUsageRecord.api_key_id, DbUsageRecord.model_config_name
        )
    )
    if wanted.until is not None:
        recorded = recorded.where(DbUsageRecord.enqueued_at < wanted.until)
    if wanted.key_id is not None:
        recorded = recorded.where(DbUsageRecord.api_key_id == wanted.key_id)
    if wanted.user_id is not None:
        recorded = recorded.where(DbUsageRecord.user_id == wanted.user_id)
    if wanted.model is not None:
        recorded = recorded.where(DbUsageRecord.model_config_name == wanted.model)
    merged: dict[tuple[date, str | None, str | None, str | None], DayUsage] = {}
    for rows in ((await session.exec(live)).all(), (await session.exec(recorded)).all()):
        for raw_day, user_id, key_id, model, requests, prompt, completion in rows:
            at = (_as_date(raw_day), user_id, key_id, model)
            row = merged.setdefault(at, DayUsage(*at))
            row.requests += int(requests or 0)
            row.prompt_tokens += int(prompt or 0)
            row.completion_tokens += int(completion or 0)
    return sorted(merged.values(), key=lambda r: (r.day, r.key_id or "", r.model or "", r.user_id or ""))


def totals(rows: Iterable[DayUsage], prices: Prices) -> tuple[int, int]:
    """Tokens and micro-dollars of ``rows``."""
    tokens = micro = 0
    for row in rows:
        tokens += row.tokens
        micro += prices.micro_usd(row.model, row.prompt_tokens, row.completion_tokens)
    return tokens, micro


async def subject_usage_since(
    session: AsyncSession, kind: SubjectKind, subject_id: str, since: datetime, prices: Prices
) -> tuple[int, int]:
    """Tokens and micro-dollars the key or user used since ``since``."""
    if kind == "key":
        wanted = UsageFilter(since=since, key_id=subject_id)
    else:
        wanted = UsageFilter(since=since, user_id=subject_id)
    return totals(await usage_by_day(session, wanted), prices)
