"""Chat and message queries scoped to their owner: another user's chat is simply not found."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple

from sqlalchemy import ColumnElement, and_, delete, func, or_
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.chats.usage_records import record_generations
from oasst_inference_server.db.models import DbChat, DbMessage, DbMessageEvaluation, DbReport, DbUser, utcnow
from oasst_inference_server.dispatch.message_lifecycle import ACTIVE_STATES
from oasst_inference_server.domain_errors import InvalidRequest, not_found
from oasst_inference_server.events import to_message_read
from oasst_shared.schemas import ChatListRead, ChatRead, MessageRead, MessageState, Role

if TYPE_CHECKING:
    from oasst_inference_server.dispatch.message_lifecycle import MessageLifecycle

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


async def get_own_chat_message(
    session: AsyncSession, user: DbUser, chat_id: str, message_id: str
) -> DbMessage:
    """:func:`get_own_chat` then :func:`get_chat_message` (the same errors), in one query."""
    in_chat = and_(DbMessage.id == message_id, DbMessage.chat_id == DbChat.id)
    row = (
        await session.exec(
            select(DbChat, DbMessage).outerjoin(DbMessage, in_chat).where(DbChat.id == chat_id)
        )
    ).first()
    if row is None or row[0].user_id != user.id:
        raise not_found("chat")
    if row[1] is None:
        raise not_found("message")
    return row[1]


async def get_parent_message(session: AsyncSession, chat: DbChat, parent_id: str) -> DbMessage:
    """The message of ``chat`` a new message answers (``InvalidRequest`` if it is not in the chat)."""
    parent = await session.get(DbMessage, parent_id)
    if parent is None or parent.chat_id != chat.id:
        raise InvalidRequest("parent_not_found", f"parent message {parent_id} is not in this chat")
    return parent


async def chat_messages(session: AsyncSession, chat_id: str) -> list[DbMessage]:
    result = await session.exec(
        select(DbMessage).where(DbMessage.chat_id == chat_id).order_by(DbMessage.created_at, DbMessage.id)
    )
    return list(result.all())


class ChatSize(NamedTuple):
    messages: int
    characters: int  # of every message's content: the prompt estimate of a new answer's ticket


async def chat_size(session: AsyncSession, chat_id: str) -> ChatSize:
    """How many messages the chat holds and how long they are, in one query."""
    count, characters = (
        await session.exec(
            select(func.count(), func.coalesce(func.sum(func.length(DbMessage.content)), 0)).where(
                DbMessage.chat_id == chat_id
            )
        )
    ).one()
    return ChatSize(int(count), int(characters))


async def count_user_chats(session: AsyncSession, user_id: str) -> int:
    """How many chats the user has (hidden ones included)."""
    return int((await session.exec(select(func.count()).where(DbChat.user_id == user_id))).one())


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


def message_read(message: DbMessage, reports: list[str] | None = None) -> MessageRead:
    """The message with the owner's feedback on it (vote score and report types)."""
    read = to_message_read(message)
    read.reports = reports or []
    return read


async def message_reports(session: AsyncSession, message_ids: list[str]) -> dict[str, list[str]]:
    if not message_ids:
        return {}
    rows = await session.exec(
        select(DbReport.message_id, DbReport.report_type)
        .where(DbReport.message_id.in_(message_ids))
        .order_by(DbReport.created_at)
    )
    out: dict[str, list[str]] = {}
    for message_id, report_type in rows.all():
        out.setdefault(message_id, []).append(report_type)
    return out


async def message_read_with_feedback(session: AsyncSession, message: DbMessage) -> MessageRead:
    reports = await message_reports(session, [message.id])
    return message_read(message, reports.get(message.id))


async def chat_read(session: AsyncSession, chat: DbChat) -> ChatRead:
    messages = await chat_messages(session, chat.id)
    reports = await message_reports(session, [m.id for m in messages])
    return ChatRead(
        **to_chat_list_read(chat).model_dump(),
        messages=[message_read(m, reports.get(m.id)) for m in messages],
    )


def title_from_prompt(content: str) -> str:
    line = " ".join(content.split())
    return line if len(line) <= TITLE_LENGTH else line[: TITLE_LENGTH - 1] + "…"


_REPLY_STATES = (MessageState.complete, MessageState.cancelled)


async def create_user_chat(session: AsyncSession, user: DbUser, title: str | None) -> DbChat:
    """A new, empty chat of ``user`` (committed)."""
    chat = DbChat(user_id=user.id, title=title)
    session.add(chat)
    await session.commit()
    return chat


async def add_prompter_message(
    session: AsyncSession, chat: DbChat, parent_id: str | None, content: str, *, size: ChatSize | None = None
) -> DbMessage:
    """Add the user's message (committed): the chat's first message, or a reply to a finished assistant
    message of the chat (``InvalidRequest`` otherwise). It becomes the tail of the chat's active thread.
    ``size``: as for :func:`stage_prompter_message`."""
    message = await stage_prompter_message(session, chat, parent_id, content, size=size)
    await session.commit()
    return message


async def stage_prompter_message(
    session: AsyncSession, chat: DbChat, parent_id: str | None, content: str, *, size: ChatSize | None = None
) -> DbMessage:
    """As :func:`add_prompter_message`, flushed but not committed: the caller commits it with more.
    ``size``: the chat's, if the caller has just counted it (whether the chat is empty is then known)."""
    if parent_id is None:
        if size is not None:
            has_root = size.messages > 0
        else:
            has_root = (
                await session.exec(select(DbMessage.id).where(DbMessage.chat_id == chat.id).limit(1))
            ).first() is not None
        if has_root:
            raise InvalidRequest("parent_required", "the chat already has messages: give parent_id")
    else:
        parent = await get_parent_message(session, chat, parent_id)
        if parent.role != Role.assistant:
            raise InvalidRequest(
                "parent_not_assistant", "a prompter message must answer an assistant message"
            )
        if parent.state not in _REPLY_STATES:
            raise InvalidRequest("parent_not_complete", f"the parent message is {parent.state}")
    message = DbMessage(
        chat_id=chat.id,
        parent_id=parent_id,
        role=Role.prompter,
        content=content,
        state=MessageState.manual,
    )
    session.add(message)
    chat.modified_at = utcnow()
    chat.active_thread_tail_message_id = message.id
    if chat.title is None:
        chat.title = title_from_prompt(content)
    session.add(chat)
    await session.flush()
    return message


# ---------------------------------------------------------------- listing with cursors


def encode_cursor(chat: DbChat) -> str:
    raw = f"{chat.created_at.isoformat()}|{chat.id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        moment, chat_id = raw.split("|", 1)
        when = datetime.fromisoformat(moment)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        when = None
    # The cursors this API writes carry their time zone; the column refuses a time without one.
    if when is None or when.tzinfo is None:
        raise InvalidRequest("invalid_cursor", f"{cursor[:40]!r} is not a cursor from this API")
    return when, chat_id


async def list_user_chats(
    session: AsyncSession,
    user: DbUser,
    *,
    include_hidden: bool,
    limit: int,
    after: str | None,
    before: str | None,
) -> tuple[list[DbChat], str | None, str | None]:
    """A page of the user's chats, newest first, and the (next, prev) cursors.

    ``after`` pages towards older chats (pass ``next``), ``before`` towards newer ones (pass
    ``prev``). Cursors are positions (creation time and id), so chats created or deleted meanwhile
    do not shift the pages.
    """
    if after is not None and before is not None:
        raise InvalidRequest("invalid_cursor", "give either after or before, not both")
    query = select(DbChat).where(DbChat.user_id == user.id)
    if not include_hidden:
        query = query.where(DbChat.hidden == False)  # noqa: E712 - SQL expression
    newest_first = (DbChat.created_at.desc(), DbChat.id.desc())
    if after is not None:
        moment, chat_id = decode_cursor(after)
        query = query.where(
            or_(DbChat.created_at < moment, and_(DbChat.created_at == moment, DbChat.id < chat_id))
        ).order_by(*newest_first)
    elif before is not None:
        moment, chat_id = decode_cursor(before)
        query = query.where(
            or_(DbChat.created_at > moment, and_(DbChat.created_at == moment, DbChat.id > chat_id))
        ).order_by(DbChat.created_at.asc(), DbChat.id.asc())
    else:
        query = query.order_by(*newest_first)
    rows = list((await session.exec(query.limit(limit + 1))).all())
    more = len(rows) > limit
    chats = rows[:limit]
    if before is not None:
        chats.reverse()
    next_cursor = prev_cursor = None
    if chats:
        if more or before is not None:
            next_cursor = encode_cursor(chats[-1])
        if after is not None or (before is not None and more):
            prev_cursor = encode_cursor(chats[0])
    else:
        prev_cursor, next_cursor = after, before
    return chats, next_cursor, prev_cursor


# ---------------------------------------------------------------- deletion


async def cancel_active_messages(
    session: AsyncSession, lifecycle: MessageLifecycle, condition: ColumnElement[bool]
) -> int:
    """Cancel every pending or running message matching ``condition`` (on whichever replica runs it)."""
    active = await session.exec(select(DbMessage).where(condition, DbMessage.state.in_(ACTIVE_STATES)))
    count = 0
    for message in list(active):
        await lifecycle.request_cancel(message)
        count += 1
    return count


async def delete_chat(session: AsyncSession, lifecycle: MessageLifecycle, chat: DbChat) -> None:
    """Cancel the chat's running messages, then delete it with its messages and feedback; commits."""
    await cancel_active_messages(session, lifecycle, DbMessage.chat_id == chat.id)
    owner = await session.get(DbUser, chat.user_id)
    if owner is not None:
        # Rate limits and usage keep counting the chat's generations (usage_records.py).
        await record_generations(session, owner, DbMessage.chat_id == chat.id)
    message_ids = select(DbMessage.id).where(DbMessage.chat_id == chat.id).scalar_subquery()
    await session.exec(delete(DbMessageEvaluation).where(DbMessageEvaluation.chat_id == chat.id))
    await session.exec(delete(DbReport).where(DbReport.message_id.in_(message_ids)))
    # One statement for all messages: the parent links point only within the set being deleted.
    await session.exec(delete(DbMessage).where(DbMessage.chat_id == chat.id))
    await session.exec(delete(DbChat).where(DbChat.id == chat.id))
    await session.commit()
