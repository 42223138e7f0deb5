"""What an answered OpenAI-API request leaves in the database: its usage, not its text.

One statement erases the results of the request just answered (and of the user's older requests left
behind, answered long enough ago that no handler still reads them), and without
``store_api_conversations`` their prompts and answers too, unless they were kept as a chat. Every
``/v1`` answer runs it, so on Postgres it is SQL of its own on the asyncpg connection (:mod:`..db.driver`:
a quarter of the ORM's CPU), shared by the scrubs asked while one runs; on SQLite it is the ORM's
statement, which means the same.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import case, null, or_, update
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.db.batched import Batched
from oasst_inference_server.db.driver import driver_connections, sql_values
from oasst_inference_server.db.models import DbMessage, MessageKind, utcnow
from oasst_shared.schemas import MessageState

API_KINDS = (MessageKind.completion, MessageKind.embedding)
_TERMINAL_STATES = tuple(s for s in MessageState if s.is_terminal and s != MessageState.manual)
SWEEP_AGE = timedelta(minutes=10)  # answered long enough ago that no handler still reads it
# The columns that hold a request's text: erased unless it is kept (as a chat, or by the setting).
_TEXT = ("content", "request_payload", "system_prompt")


def scrub_statement(keep_text: bool) -> str:
    """The driver path's statement for many answered requests at once: ``$1`` their ids, ``$2`` their
    users, ``$3`` the sweep's age limit. Its rows are locked first in the order of their ids, as every
    statement that changes several messages locks them (``dispatch.answer_ends``): no deadlock."""
    sets = ["result_payload = NULL"]
    left = "result_payload IS NOT NULL"
    if not keep_text:
        sets += [f"{name} = CASE WHEN chat_id IS NULL THEN NULL ELSE {name} END" for name in _TEXT]
        held = " OR ".join(f"{name} IS NOT NULL" for name in _TEXT)
        left = f"{left} OR (chat_id IS NULL AND ({held}))"
    scrubbed = (
        f"kind IN ({sql_values(API_KINDS)}) AND state IN ({sql_values(_TERMINAL_STATES)}) "
        f"AND (id = ANY($1::text[]) OR (user_id = ANY($2::text[]) AND finished_at < $3)) AND ({left})"
    )
    return (
        f"WITH locked AS MATERIALIZED (SELECT id FROM message WHERE {scrubbed} ORDER BY id FOR UPDATE) "
        f"UPDATE message SET {', '.join(sets)} WHERE id IN (SELECT id FROM locked) AND {scrubbed}"
    )


class ApiScrub:
    def __init__(self, session_factory: async_sessionmaker[AsyncSession], keep_text: bool) -> None:
        self._sessions = session_factory
        self._keep_text = keep_text
        self._driver = driver_connections(session_factory.kw["bind"])
        self._statement = scrub_statement(keep_text)
        # Postgres: the scrubs asked while one runs share the next statement (:mod:`..db.batched`), as
        # answers' ends do. 10,000 answers ending within seconds made 10,000 scrubs, which waited more than
        # the pool's 30 s for a connection when each had a statement of its own.
        self._batched: Batched[DbMessage, None] = Batched(self._scrub_all, limit=4, name="API scrubs")

    async def scrub(self, message: DbMessage) -> None:
        """Erase the content of one answered request (and of the user's older ones left behind)."""
        if self._driver is not None:
            await self._batched.ask(message)
            return
        swept_before = utcnow() - SWEEP_AGE
        owned = (DbMessage.user_id == message.user_id) & DbMessage.kind.in_(API_KINDS)
        finished = DbMessage.state.in_(_TERMINAL_STATES)
        this_or_old = (DbMessage.id == message.id) | (DbMessage.finished_at < swept_before)
        left = DbMessage.result_payload.is_not(None)
        values: dict[str, Any] = {"result_payload": null()}  # SQL NULL, not JSON null
        if not self._keep_text:
            unkept = DbMessage.chat_id.is_(None)
            text = tuple(getattr(DbMessage, name) for name in _TEXT)
            left = left | (unkept & or_(*(column.is_not(None) for column in text)))
            values.update({column.key: case((unkept, null()), else_=column) for column in text})
        async with self._sessions() as session:
            await session.exec(update(DbMessage).where(owned, finished, this_or_old, left).values(**values))
            await session.commit()

    async def _scrub_all(self, messages: list[DbMessage]) -> list[None]:
        assert self._driver is not None
        ids = [message.id for message in messages]
        users = sorted({message.user_id for message in messages if message.user_id is not None})
        async with self._driver.connection() as connection:
            await connection.execute(self._statement, ids, users, utcnow() - SWEEP_AGE)
        return [None] * len(messages)
