"""Deleting an account: the user is anonymised, not removed, so shared data keeps its links.

What ``DELETE /account`` (and the admin's ``DELETE /admin/users/{id}``) does, in this order:

1. every pending or running generation of the user is cancelled (on whichever replica runs it);
2. chats that did not allow data use are deleted with their messages and feedback;
3. the other chats are kept as anonymous data: titles cleared, hidden;
4. the generations of the account are kept as usage records (rate limits of a new account of the
   same sign-in identity count them);
5. refresh tokens and API keys are revoked and client settings deleted; access tokens stop working
   at once (the user is marked deleted, which every authenticated request checks);
6. the user row loses its name and provider account: ``display_name`` becomes "deleted user",
   ``provider`` "deleted", ``provider_account_id`` the user's own id. The same person signing in
   again through a provider gets a new, empty account.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loguru import logger
from sqlalchemy import delete, update
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.auth.refresh_tokens import revoke_user_tokens
from oasst_inference_server.chats.chat_store import cancel_active_messages, delete_chat
from oasst_inference_server.chats.usage_records import record_generations
from oasst_inference_server.db.models import (
    DbApiKey,
    DbChat,
    DbMessage,
    DbModerationFlag,
    DbUser,
    DbUserSettings,
    utcnow,
)

if TYPE_CHECKING:
    from oasst_inference_server.dispatch.message_lifecycle import MessageLifecycle

DELETED_DISPLAY_NAME = "deleted user"


async def delete_account(session: AsyncSession, lifecycle: MessageLifecycle, user: DbUser) -> None:
    user_id = user.id
    chat_ids = select(DbChat.id).where(DbChat.user_id == user_id).scalar_subquery()
    cancelled = await cancel_active_messages(
        session,
        lifecycle,
        (DbMessage.user_id == user_id) | DbMessage.chat_id.in_(chat_ids),
    )
    private = await session.exec(
        select(DbChat).where(DbChat.user_id == user_id, DbChat.allow_data_use == False)  # noqa: E712
    )
    deleted_chats = 0
    for chat in list(private):
        await delete_chat(session, lifecycle, chat)
        deleted_chats += 1
    # The generations that stay (kept chats, API requests) are recorded too: a new account of the same
    # sign-in identity meets them in its rate limits (usage_records.py).
    await record_generations(session, user, (DbMessage.user_id == user_id) | DbMessage.chat_id.in_(chat_ids))
    await session.exec(update(DbChat).where(DbChat.user_id == user_id).values(title=None, hidden=True))
    await session.exec(delete(DbUserSettings).where(DbUserSettings.user_id == user_id))
    await session.exec(delete(DbModerationFlag).where(DbModerationFlag.user_id == user_id))  # their excerpts
    await session.exec(
        update(DbApiKey)
        .where(DbApiKey.user_id == user_id, DbApiKey.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )
    await session.commit()
    await revoke_user_tokens(session, user_id)
    fresh = await session.get(DbUser, user_id)
    assert fresh is not None
    fresh.display_name = DELETED_DISPLAY_NAME
    fresh.provider = "deleted"
    fresh.provider_account_id = user_id
    fresh.deleted = True
    fresh.deleted_at = utcnow()
    session.add(fresh)
    await session.commit()
    logger.info(
        "account {} deleted: {} generations cancelled, {} private chats deleted",
        user_id,
        cancelled,
        deleted_chats,
    )
