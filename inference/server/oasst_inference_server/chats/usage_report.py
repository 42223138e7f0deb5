"""A user's usage, counted from the messages themselves (every generation is a message with its token
counts) plus the usage records of generations whose chat was deleted (``usage_records.py``); and the
user's recent API requests."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.db.models import DbApiKey, DbChat, DbMessage, DbUsageRecord, MessageKind
from oasst_inference_server.domain_errors import not_found
from oasst_shared.schemas import ApiKeyUsage, UsageRead, UsageTotals


def _totals(requests: int | None, prompt: int | None, completion: int | None) -> UsageTotals:
    prompt, completion = int(prompt or 0), int(completion or 0)
    return UsageTotals(
        requests=int(requests or 0),
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
    )


def _add(a: UsageTotals, b: UsageTotals) -> UsageTotals:
    return _totals(
        a.requests + b.requests, a.prompt_tokens + b.prompt_tokens, a.completion_tokens + b.completion_tokens
    )


_SUMS = (
    func.count(),
    func.sum(func.coalesce(DbMessage.prompt_tokens, 0)),
    func.sum(func.coalesce(DbMessage.generated_tokens, 0)),
)


async def user_usage(session: AsyncSession, user_id: str) -> UsageRead:
    """Generations (chat answers, completions, embeddings) and their tokens, per API key and in total."""
    queued = DbMessage.enqueued_at.is_not(None)
    per_key = {
        key_id: _totals(*sums)
        for key_id, *sums in (
            await session.exec(
                select(DbMessage.api_key_id, *_SUMS)
                .where(DbMessage.user_id == user_id, queued)
                .group_by(DbMessage.api_key_id)
            )
        ).all()
    }
    recorded = (
        await session.exec(
            select(
                DbUsageRecord.api_key_id,
                func.count(),
                func.sum(DbUsageRecord.prompt_tokens),
                func.sum(DbUsageRecord.generated_tokens),
            )
            .where(DbUsageRecord.user_id == user_id)
            .group_by(DbUsageRecord.api_key_id)
        )
    ).all()
    for key_id, *sums in recorded:  # generations of deleted chats (usage_records.py)
        per_key[key_id] = _add(per_key.get(key_id, UsageTotals()), _totals(*sums))
    chat_row = (
        await session.exec(
            select(*_SUMS)
            .select_from(DbMessage)
            .join(DbChat, DbChat.id == DbMessage.chat_id)
            .where(DbChat.user_id == user_id, DbMessage.user_id.is_(None), queued)
        )
    ).one()
    without_key = _add(per_key.pop(None, UsageTotals()), _totals(*chat_row))
    keys = (
        await session.exec(select(DbApiKey).where(DbApiKey.user_id == user_id).order_by(DbApiKey.created_at))
    ).all()
    api_keys = [
        ApiKeyUsage(
            api_key_id=k.id,
            name=k.name,
            prefix=k.prefix,
            revoked=k.revoked_at is not None,
            **per_key.get(k.id, UsageTotals()).model_dump(),
        )
        for k in keys
    ]
    total = without_key
    for key_usage in api_keys:
        total = _add(total, UsageTotals(**key_usage.model_dump(include=set(UsageTotals.model_fields))))
    return UsageRead(total=total, api_keys=api_keys, without_api_key=without_key)


async def recent_api_requests(
    session: AsyncSession, user_id: str, kinds: Sequence[MessageKind], limit: int, api_key_id: str | None
) -> list[DbMessage]:
    """The user's most recent messages of the given kinds, newest first (only ``api_key_id``'s if given)."""
    query = select(DbMessage).where(DbMessage.user_id == user_id, DbMessage.kind.in_(kinds))
    if api_key_id is not None:
        query = query.where(DbMessage.api_key_id == api_key_id)
    return list((await session.exec(query.order_by(DbMessage.created_at.desc()).limit(limit))).all())


async def get_api_request(
    session: AsyncSession, user_id: str, kinds: Sequence[MessageKind], request_id: str
) -> DbMessage:
    """The user's message ``request_id`` of one of the given kinds (``not_found`` otherwise)."""
    message = await session.get(DbMessage, request_id)
    if message is None or message.user_id != user_id or message.kind not in kinds:
        raise not_found("request")
    return message
