"""The claim's statements: a pending message taken for one worker session, returned with the rows its
work frame is built from, inside the caller's transaction.

On Postgres one statement does it, a data-modifying CTE: the conditional ``UPDATE`` (only a message still
pending moves to in_progress) returns the row, and the same statement reads the messages of its chat.
On SQLite (the embedded default, one process) an ``UPDATE ... RETURNING`` and a ``SELECT`` run instead.
Either way the updated row stays locked until the caller's transaction ends, so no other session can
take the message meanwhile: a second claim waits for that transaction, then finds it no longer pending
(or, after a rollback, takes it).

May import db; nothing of the API, the broker or the worker connections.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import JSON, bindparam, func, select, type_coerce, update
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.db.models import DbMessage, MessageKind
from oasst_shared.protocol import ChatTurn
from oasst_shared.schemas import MessageState, Role

_MESSAGES = DbMessage.__table__


class ChatRow(NamedTuple):
    """What a work frame needs of one message of the claimed message's chat."""

    id: str
    parent_id: str | None
    role: str
    content: str | None


class Taken(NamedTuple):
    message: DbMessage  # as the claim left it (in_progress, attempts counted)
    chat: list[ChatRow]  # the messages of its chat; empty unless it is a chat message


def thread_to(parent_id: str | None, chat: Sequence[ChatRow]) -> list[ChatTurn]:
    """The conversation from the root to ``parent_id``, oldest first."""
    by_id = {row.id: row for row in chat}
    turns: list[ChatTurn] = []
    current = by_id.get(parent_id) if parent_id else None
    while current is not None:
        speaker = "user" if current.role == Role.prompter.value else "assistant"
        turns.append(ChatTurn(role=speaker, content=current.content or ""))
        current = by_id.get(current.parent_id) if current.parent_id else None
    turns.reverse()
    return turns


def _reads_chat(message: DbMessage) -> bool:
    return message.kind == MessageKind.chat and message.chat_id is not None


# Built once: constructing these statements costs more CPU than a round trip to the database.
# The values a claim sets (beyond the state and the attempt count).
CLAIM_VALUES = ("worker_session_id", "lease_deadline", "started_at", "generation_deadline")
_CLAIM = (
    update(_MESSAGES)
    .where(_MESSAGES.c.id == bindparam("message_id"), _MESSAGES.c.state == MessageState.pending)
    .values(
        state=MessageState.in_progress,
        attempts=_MESSAGES.c.attempts + 1,
        **{name: bindparam(name, type_=_MESSAGES.c[name].type) for name in CLAIM_VALUES},
    )
    .returning(*_MESSAGES.c)
)
_CHAT_ROWS = select(_MESSAGES.c.id, _MESSAGES.c.parent_id, _MESSAGES.c.role, _MESSAGES.c.content).where(
    _MESSAGES.c.chat_id == bindparam("chat_id")
)


def _claim_with_chat() -> Any:
    claimed = _CLAIM.cte("claimed")
    turn = _MESSAGES.alias("turn")
    chat_rows = (
        select(func.json_agg(func.json_build_array(turn.c.id, turn.c.parent_id, turn.c.role, turn.c.content)))
        .where(turn.c.chat_id == claimed.c.chat_id, claimed.c.kind == MessageKind.chat)
        .scalar_subquery()
    )
    return select(claimed, type_coerce(chat_rows, JSON).label("chat_rows"))


_CLAIM_WITH_CHAT = _claim_with_chat()


async def take(session: AsyncSession, message_id: str, values: dict[str, Any]) -> Taken | None:
    """Move ``message_id`` from pending to in_progress with ``values`` (each of :data:`CLAIM_VALUES`)
    set and its attempt counted, in ``session``'s transaction (not committed here); None if it is not
    pending (taken, cancelled or finished meanwhile)."""
    params = {"message_id": message_id, **{name: values.get(name) for name in CLAIM_VALUES}}
    connection = await session.connection()
    if connection.dialect.name != "postgresql":
        row = (await connection.execute(_CLAIM, params)).first()
        if row is None:
            return None
        message = DbMessage(**row._asdict())
        return Taken(message, await conversation(session, message))
    row = (await connection.execute(_CLAIM_WITH_CHAT, params)).first()
    if row is None:
        return None
    fields = row._asdict()
    chat = [ChatRow(*r) for r in fields.pop("chat_rows") or []]
    return Taken(DbMessage(**fields), chat)


async def conversation(
    session: AsyncSession, message: DbMessage, known: Sequence[DbMessage] = ()
) -> list[ChatRow]:
    """The messages of ``message``'s chat as ``session``'s transaction sees them (empty unless it is a
    chat message): what :func:`take` returns with a claim, for a message not yet written. Where
    ``known`` (messages the caller holds, its parent first) already holds the whole way from the parent
    to the chat's first message, as for a new chat's first answer, nothing is read."""
    if not _reads_chat(message):
        return []
    rows = {m.id: ChatRow(m.id, m.parent_id, Role(m.role).value, m.content) for m in known}
    current = rows.get(message.parent_id) if message.parent_id else None
    while current is not None and current.parent_id is not None:
        current = rows.get(current.parent_id)
    if current is not None:  # the way up ended at the first message: the thread is known
        return list(rows.values())
    connection = await session.connection()
    result = await connection.execute(_CHAT_ROWS, {"chat_id": message.chat_id})
    return [ChatRow(i, p, Role(r).value, c) for i, p, r, c in result.all()]
