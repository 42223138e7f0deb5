"""Usage that outlives its messages: deleting a chat or an account never resets rate limits or usage.

Rate limits and ``GET /usage`` count generations from the messages themselves. Before messages are
deleted (with their chat, or the private chats of a deleted account), each generation among them is
copied into ``usage_record`` with its token counts, in one ``INSERT ... SELECT``; both readers add
the records to what the live messages show. A record also carries the *subject*, a hash of the
sign-in identity (provider and provider account): a person who deletes their account and signs in
again gets a new user, and the rate limits still count the old account's generations through it.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import ColumnElement, func, insert, literal, select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.db.models import DbMessage, DbUsageRecord, DbUser, utcnow


def subject_of(user: DbUser) -> str:
    """The hash of the user's sign-in identity (the same for a new account of the same person)."""
    return identity_subject(user.provider, user.provider_account_id)


def identity_subject(provider: str, provider_account_id: str) -> str:
    """``subject_of`` a user with this sign-in identity."""
    return hashlib.sha256(f"{provider}\x00{provider_account_id}".encode()).hexdigest()


async def record_generations(session: AsyncSession, user: DbUser, condition: ColumnElement[bool]) -> None:
    """Copy the generations among the messages matching ``condition`` into usage records (once each);
    the caller deletes the messages and commits."""
    already = select(DbUsageRecord.message_id).where(DbUsageRecord.message_id == DbMessage.id).exists()
    rows = select(
        DbMessage.id,
        literal(user.id),
        literal(subject_of(user)),
        DbMessage.api_key_id,
        DbMessage.kind,
        DbMessage.model_config_name,
        DbMessage.enqueued_at,
        func.coalesce(DbMessage.prompt_tokens, 0),
        func.coalesce(DbMessage.generated_tokens, 0),
        literal(utcnow()),
    ).where(condition, DbMessage.enqueued_at.is_not(None), ~already)
    columns = [
        "message_id",
        "user_id",
        "subject",
        "api_key_id",
        "kind",
        "model_config_name",
        "enqueued_at",
        "prompt_tokens",
        "generated_tokens",
        "recorded_at",
    ]
    await session.exec(insert(DbUsageRecord).from_select(columns, rows))
