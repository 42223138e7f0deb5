"""Changes the owner makes to a chat (title, hidden, data use, active thread; hide all) and feedback on
its answers (votes, reports, evaluations). Another user's chat is simply not found."""

from __future__ import annotations

from sqlalchemy import update
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.chats.chat_store import get_chat_message, get_own_chat
from oasst_inference_server.db.models import DbChat, DbMessage, DbMessageEvaluation, DbReport, DbUser, utcnow
from oasst_inference_server.domain_errors import InvalidRequest
from oasst_shared.schemas import ChatUpdateRequest, Role


async def hide_user_chats(session: AsyncSession, user: DbUser) -> None:
    """Hide every chat of the user (committed)."""
    await session.exec(
        update(DbChat).where(DbChat.user_id == user.id, DbChat.hidden == False).values(hidden=True)  # noqa: E712
    )
    await session.commit()


async def update_chat(session: AsyncSession, user: DbUser, chat_id: str, body: ChatUpdateRequest) -> DbChat:
    """Apply the fields set in ``body`` to the user's chat (committed); omitted fields stay."""
    chat = await get_own_chat(session, user, chat_id)
    changes = body.model_dump(exclude_unset=True)
    if "title" in changes:
        title = (body.title or "").strip()
        chat.title = title or None
    if body.hidden is not None:
        chat.hidden = body.hidden
    if body.allow_data_use is not None:
        chat.allow_data_use = body.allow_data_use
    if body.active_thread_tail_message_id is not None:
        tail = await session.get(DbMessage, body.active_thread_tail_message_id)
        if tail is None or tail.chat_id != chat.id:
            raise InvalidRequest(
                "message_not_in_chat", "active_thread_tail_message_id is not a message of this chat"
            )
        chat.active_thread_tail_message_id = tail.id
    chat.modified_at = utcnow()
    session.add(chat)
    await session.commit()
    return chat


async def _own_answer(
    session: AsyncSession, user: DbUser, chat_id: str, message_id: str, action: str
) -> tuple[DbChat, DbMessage]:
    """The user's chat and one of its assistant messages (feedback is only for answers)."""
    chat = await get_own_chat(session, user, chat_id)
    message = await get_chat_message(session, chat, message_id)
    if message.role != Role.assistant:
        raise InvalidRequest("not_assistant_message", f"only assistant messages can be {action}")
    return chat, message


async def vote_on_answer(
    session: AsyncSession, user: DbUser, chat_id: str, message_id: str, score: int
) -> None:
    """Set the answer's vote (committed): 1 good, -1 bad, 0 none."""
    _, message = await _own_answer(session, user, chat_id, message_id, "voted on")
    message.score = score
    session.add(message)
    await session.commit()


async def report_answer(
    session: AsyncSession, user: DbUser, chat_id: str, message_id: str, report_type: str, reason: str
) -> None:
    """Record a report on the answer (committed)."""
    _, message = await _own_answer(session, user, chat_id, message_id, "reported")
    session.add(DbReport(message_id=message.id, user_id=user.id, report_type=report_type, reason=reason))
    await session.commit()


async def evaluate_answer(
    session: AsyncSession, user: DbUser, chat_id: str, message_id: str, inferior_message_ids: list[str]
) -> None:
    """Record that the answer is better than ``inferior_message_ids``, other answers to the same prompt
    (committed; ``InvalidRequest`` if they are not)."""
    chat, selected = await _own_answer(session, user, chat_id, message_id, "evaluated")
    inferior = set(inferior_message_ids)
    if selected.id in inferior:
        raise InvalidRequest("invalid_evaluation", "a message cannot be inferior to itself")
    siblings = set(
        (
            await session.exec(
                select(DbMessage.id).where(
                    DbMessage.chat_id == chat.id,
                    DbMessage.parent_id == selected.parent_id,
                    DbMessage.role == Role.assistant,
                )
            )
        ).all()
    )
    strangers = sorted(inferior - siblings)
    if strangers:
        raise InvalidRequest(
            "invalid_evaluation",
            f"not other answers to the same prompt in this chat: {', '.join(strangers)}",
        )
    session.add(
        DbMessageEvaluation(
            chat_id=chat.id,
            user_id=user.id,
            selected_message_id=selected.id,
            inferior_message_ids=sorted(inferior),
        )
    )
    await session.commit()
