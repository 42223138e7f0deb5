"""Chat and message queries scoped to their owner: another user's chat is simply not found."""

from __future__ import annotations

from sqlalchemy import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.errors import not_found
from oasst_inference_server.message_lifecycle import to_message_read
from oasst_inference_server.models import DbChat, DbMessage, DbUser
from oasst_shared.schemas import ChatListRead, ChatRead

TITLE_LENGTH = 100


async def get_own_chat(session: AsyncSession, user: DbUser, chat_id: str) -> DbChat:
    chat = await session.get(DbChat, chat_id)
    if chat is None or chat.user_id != user.id:
        raise not_found("chat")
    return chat


async def get_chat_message(session: AsyncSession, chat: DbChat, message_id: str) -> DbMessage:
    message = await session.get(DbMessage, message_id)
    if message is None or message.chat_id != chat.id:
        raise not_found("message")
    return message


async def chat_messages(session: AsyncSession, chat_id: str) -> list[DbMessage]:
    result = await session.execute(
        select(DbMessage).where(DbMessage.chat_id == chat_id).order_by(DbMessage.created_at, DbMessage.id)
    )
    return list(result.scalars().all())


def to_chat_list_read(chat: DbChat) -> ChatListRead:
    return ChatListRead(
        id=chat.id,
        created_at=chat.created_at,
        modified_at=chat.modified_at,
        title=chat.title,
        hidden=chat.hidden,
        allow_data_use=chat.allow_data_use,
        active_thread_tail_message_id=chat.active_thread_tail_message_id,
    )


def to_chat_read(chat: DbChat, messages: list[DbMessage]) -> ChatRead:
    return ChatRead(**to_chat_list_read(chat).model_dump(), messages=[to_message_read(m) for m in messages])


def title_from_prompt(content: str) -> str:
    line = " ".join(content.split())
    return line if len(line) <= TITLE_LENGTH else line[: TITLE_LENGTH - 1] + "…"
