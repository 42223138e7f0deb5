"""Reading the chats of an export from the database, one bounded batch of chats at a time.

A batch is four queries: the chats (keyset-paged by id, the primary key's index), then their messages,
reports and evaluations. Each batch has its own short session, so an export of any size holds one batch
in memory and no long transaction.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from sqlalchemy import ColumnElement, or_
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.chats.export.selection import ExportSelection
from oasst_inference_server.db.models import (
    DbChat,
    DbMessage,
    DbMessageEvaluation,
    DbReport,
    DbUser,
    MessageKind,
)
from oasst_shared.schemas import MessageState, Role


@dataclass
class ChatRecords:
    """One chat as the export reads it."""

    chat: DbChat
    owner_deleted: bool
    # Its exportable messages (prompts, and answers that completed), oldest first.
    messages: list[DbMessage] = field(default_factory=list)
    reports: list[DbReport] = field(default_factory=list)
    evaluations: list[DbMessageEvaluation] = field(default_factory=list)


def _chat_filters(selection: ExportSelection) -> list[ColumnElement[bool]]:
    filters: list[ColumnElement[bool]] = [col(DbChat.allow_data_use).is_(True)]
    if selection.since is not None:
        filters.append(col(DbChat.created_at) >= selection.since)
    if selection.until is not None:
        filters.append(col(DbChat.created_at) < selection.until)
    if selection.user_id is not None:
        filters.append(col(DbChat.user_id) == selection.user_id)
    if not selection.include_deleted:
        filters.append(col(DbUser.deleted).is_(False))
    return filters


# Prompts are the user's own text; answers count once they completed (a cancelled or failed answer's
# partial text is not a sample of the model's answers).
_EXPORTABLE = or_(col(DbMessage.role) == Role.prompter, col(DbMessage.state) == MessageState.complete)


async def _chat_page(
    session: AsyncSession, selection: ExportSelection, after: str | None, size: int
) -> list[tuple[DbChat, bool]]:
    query = select(DbChat, DbUser.deleted).join(DbUser, col(DbUser.id) == col(DbChat.user_id))
    query = query.where(*_chat_filters(selection))
    if after is not None:
        query = query.where(col(DbChat.id) > after)
    rows = (await session.exec(query.order_by(col(DbChat.id)).limit(size))).all()
    return [(chat, bool(deleted)) for chat, deleted in rows]


async def _fill(session: AsyncSession, records: dict[str, ChatRecords]) -> None:
    chat_ids = list(records)
    messages = await session.exec(
        select(DbMessage)
        .where(
            col(DbMessage.chat_id).in_(chat_ids),
            col(DbMessage.kind) == MessageKind.chat,
            col(DbMessage.content).is_not(None),
            _EXPORTABLE,
        )
        .order_by(col(DbMessage.created_at), col(DbMessage.id))
    )
    for message in messages.all():
        assert message.chat_id is not None
        records[message.chat_id].messages.append(message)
    reports = await session.exec(
        select(DbReport, DbMessage.chat_id)
        .join(DbMessage, col(DbMessage.id) == col(DbReport.message_id))
        .where(col(DbMessage.chat_id).in_(chat_ids))
        .order_by(col(DbReport.created_at), col(DbReport.id))
    )
    for report, chat_id in reports.all():
        assert chat_id is not None
        records[chat_id].reports.append(report)
    evaluations = await session.exec(
        select(DbMessageEvaluation)
        .where(col(DbMessageEvaluation.chat_id).in_(chat_ids))
        .order_by(col(DbMessageEvaluation.created_at), col(DbMessageEvaluation.id))
    )
    for evaluation in evaluations.all():
        records[evaluation.chat_id].evaluations.append(evaluation)


async def read_chat_batches(
    sessions: async_sessionmaker[AsyncSession], selection: ExportSelection, batch_size: int
) -> AsyncIterator[list[ChatRecords]]:
    """The selected chats with their messages and feedback, ``batch_size`` chats at a time, by chat id."""
    after: str | None = None
    while True:
        async with sessions() as session:
            page = await _chat_page(session, selection, after, batch_size)
            if not page:
                return
            records = {chat.id: ChatRecords(chat, deleted) for chat, deleted in page}
            await _fill(session, records)
        yield list(records.values())
        if len(page) < batch_size:
            return
        after = page[-1][0].id
