"""Whether the messages of silent streams have moved on: one database read for all of a moment's readers.

A reader whose stream has had no event for ``pending_update_interval`` asks the database for its
message's state: the stream may have expired, or Redis may have lost the terminal event, and the
database has the final word (``streams.event_reader``). One read per silent reader per interval was 10,000
reads a second with 10,000 held streams on one process, enough to empty the connection pool and fail
the streams themselves. A :class:`StateChecks` of the process gathers the questions asked within
``window`` seconds and answers them with one ``SELECT id, state`` per ``IDS_PER_STATEMENT`` messages.

Failure semantics are those of one read per reader: a read that fails raises in every reader that asked
(as its own read would have), a reader that stops waiting (its client left) is simply not answered,
and a message the database does not have is answered None.
"""

from __future__ import annotations

import asyncio
import contextlib

from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.db.models import DbMessage
from oasst_shared.schemas import MessageState

# Messages per statement: well inside every database's limit of bound parameters.
IDS_PER_STATEMENT = 500
# How long a question waits for others to share its read. Readers ask after a second of silence, each
# at its own moment: at 10,000 held streams this makes some 50 reads a second of 200 messages each.
WINDOW_SECONDS = 0.02


class StateChecks:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], window: float = WINDOW_SECONDS) -> None:
        self._sessions = sessions
        self._window = window
        # The messages asked about since the current batch started, and that batch: it reads them all
        # once its window has passed.
        self._asked: set[str] = set()
        self._batch: asyncio.Task[dict[str, MessageState]] | None = None
        self._one_read = asyncio.Lock()

    async def state(self, message_id: str) -> MessageState | None:
        """The message's state in the database, None if it has no such message."""
        self._asked.add(message_id)
        batch = self._batch
        if batch is None:
            batch = self._batch = asyncio.create_task(self._answer(), name="message state checks")
            batch.add_done_callback(_retrieved)
        # Shielded: an asker that leaves does not cancel the read of the others.
        return (await asyncio.shield(batch)).get(message_id)

    async def close(self) -> None:
        """Stop answering: the questions still open are cancelled."""
        if self._batch is not None:
            self._batch.cancel()
            with contextlib.suppress(BaseException):
                await self._batch

    async def _answer(self) -> dict[str, MessageState]:
        try:
            await asyncio.sleep(self._window)
            # One read at a time: while the last one is still reading (a slow database), questions join
            # this batch rather than each window's batch queueing for a connection of its own.
            await self._one_read.acquire()
        finally:
            # Questions asked from here on start the next batch.
            asked, self._asked, self._batch = self._asked, set(), None
        try:
            states: dict[str, MessageState] = {}
            ids = sorted(asked)
            async with self._sessions() as session:
                for start in range(0, len(ids), IDS_PER_STATEMENT):
                    chunk = ids[start : start + IDS_PER_STATEMENT]
                    rows = await session.exec(
                        select(DbMessage.id, DbMessage.state).where(col(DbMessage.id).in_(chunk))
                    )
                    states.update((message_id, MessageState(state)) for message_id, state in rows.all())
            return states
        finally:
            self._one_read.release()


def _retrieved(batch: asyncio.Task[dict[str, MessageState]]) -> None:
    """Mark a failed batch's error as seen: every asker may have left before it failed."""
    if not batch.cancelled():
        batch.exception()
