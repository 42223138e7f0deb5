"""Per-request and per-user bounds from the settings that the request schemas cannot know.

The schemas in ``oasst_shared`` hold the hard bounds (``oasst_shared.limits``); these checks apply
the deployment's settings on top: system-prompt length, messages per OpenAI-style request, chats
per user. Each refusal is a domain error naming the limit. (Chat length and the queue are in
``limits.py``, generation rates in ``rate_limit.py``, event-stream readers in ``reader_slots.py``.)
"""

from __future__ import annotations

from sqlalchemy import func
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.db.models import DbChat
from oasst_inference_server.domain_errors import Conflict, InvalidRequest, InvalidValue
from oasst_inference_server.openai_protocol.generation_requests import ChatCompletionRequest
from oasst_inference_server.settings import Settings

_SYSTEM_ROLES = ("system", "developer")


def check_system_prompt(settings: Settings, system_prompt: str | None, param: str = "system_prompt") -> None:
    if system_prompt is not None and len(system_prompt) > settings.max_system_prompt_length:
        raise InvalidValue(
            "system_prompt_too_long",
            f"the system prompt has {len(system_prompt)} characters; this server accepts "
            f"{settings.max_system_prompt_length}",
            param=param,
        )


def check_chat_completion_bounds(settings: Settings, body: ChatCompletionRequest) -> None:
    """Messages per request, and the length of each system message and of each user message."""
    if len(body.messages) > settings.max_messages_per_request:
        raise InvalidRequest(
            "too_many_messages",
            f"the request has {len(body.messages)} messages; this server accepts "
            f"{settings.max_messages_per_request}",
            param="messages",
        )
    for index, message in enumerate(body.messages):
        param = f"messages[{index}].content"
        if message.role in _SYSTEM_ROLES:
            check_system_prompt(settings, message.text, param)
        elif message.role == "user" and len(message.text) > settings.max_message_length:
            raise InvalidRequest(
                "message_too_long",
                f"{param} has {len(message.text)} characters; this server accepts "
                f"{settings.max_message_length}",
                param=param,
            )


async def check_chat_count(session: AsyncSession, settings: Settings, user_id: str) -> None:
    chats = (await session.exec(select(func.count()).where(DbChat.user_id == user_id))).one()
    if int(chats) >= settings.max_chats_per_user:
        raise Conflict(
            "too_many_chats",
            f"you have {chats} chats, the most this server keeps per user: delete some to start new ones",
        )
