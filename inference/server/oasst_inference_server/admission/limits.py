"""Limits from the settings that keep one chat, one message or one model's queue bounded.

(The per-user rate limit and concurrency cap live in ``rate_limit.py``.) Counts come from the
database, so every replica enforces the same numbers.
"""

from __future__ import annotations

from sqlalchemy import func
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.chats.chat_store import ChatSize, chat_size
from oasst_inference_server.db.models import DbMessage
from oasst_inference_server.domain_errors import Conflict, InvalidValue, ServiceUnavailable
from oasst_inference_server.settings import Settings
from oasst_shared.schemas import MessageState

QUEUE_FULL_RETRY_AFTER = 10  # seconds


def check_message_length(settings: Settings, content: str) -> None:
    if len(content) > settings.max_message_length:
        raise InvalidValue(
            "message_too_long",
            f"the message has {len(content)} characters; this server accepts {settings.max_message_length}",
        )


async def check_chat_capacity(session: AsyncSession, settings: Settings, chat_id: str) -> ChatSize:
    """``Conflict`` if the chat is full; else its size (a new answer's ticket needs its length)."""
    return check_chat_room(settings, await chat_size(session, chat_id))


def check_chat_room(settings: Settings, size: ChatSize) -> ChatSize:
    """``Conflict`` if a chat of ``size`` is full; else ``size``."""
    if size.messages >= settings.max_messages_per_chat:
        raise Conflict(
            "chat_full",
            f"the chat has reached {settings.max_messages_per_chat} messages: start a new chat",
        )
    return size


async def check_queue_capacity(session: AsyncSession, settings: Settings, model_config_name: str) -> None:
    """ServiceUnavailable (with ``retry_after``) while ``max_queue_size`` messages already wait for the model."""
    pending = (
        await session.exec(
            select(func.count()).where(
                DbMessage.state == MessageState.pending,
                DbMessage.model_config_name == model_config_name,
            )
        )
    ).one()
    if int(pending) >= settings.max_queue_size:
        raise ServiceUnavailable(
            "queue_full",
            f"{pending} messages already wait for {model_config_name!r}: try again later",
            retry_after=QUEUE_FULL_RETRY_AFTER,
        )
