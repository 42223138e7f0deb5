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
        self._asked: dict[str, list[asyncio.Future[MessageState | None]]] = {}
        self._batch: asyncio.Task[None] | None = None

    async def state(self, message_id: str) -> MessageState | None:
        """The message's state in the database, None if it has no such message."""
        future: asyncio.Future[MessageState | None] = asyncio.get_running_loop().create_future()
        self._asked.setdefault(message_id, []).append(future)
        if self._batch is None:
            self._batch = asyncio.create_task(self._answer(), name="message state checks")
        return await future

    async def close(self) -> None:
        """Stop answering: the questions still open are cancelled."""
        if self._batch is not None:
            self._batch.cancel()
            with contextlib.suppress(BaseException):
                await self._batch
        for future in _waiting(self._asked):
            future.cancel()

    async def _answer(self) -> None:
        asked: dict[str, list[asyncio.Future[MessageState | None]]] = {}
        try:
            try:
                await asyncio.sleep(self._window)
            finally:
                # Questions asked from here on start the next batch.
                asked, self._asked, self._batch = self._asked, {}, None
            states = await self._read(sorted(asked))
        except asyncio.CancelledError:
            for future in _waiting(asked):
                future.cancel()
            raise
        except Exception as exc:  # every reader that asked fails as its own read would have
            for future in _waiting(asked):
                future.set_exception(exc)
            return
        for message_id, futures in asked.items():
            for future in futures:
                if not future.done():
                    future.set_result(states.get(message_id))

    async def _read(self, ids: list[str]) -> dict[str, MessageState]:
        states: dict[str, MessageState] = {}
        async with self._sessions() as session:
            for start in range(0, len(ids), IDS_PER_STATEMENT):
                chunk = ids[start : start + IDS_PER_STATEMENT]
                rows = await session.exec(
                    select(DbMessage.id, DbMessage.state).where(col(DbMessage.id).in_(chunk))
                )
                states.update((message_id, MessageState(state)) for message_id, state in rows.all())
        return states


def _waiting(
    asked: dict[str, list[asyncio.Future[MessageState | None]]],
) -> list[asyncio.Future[MessageState | None]]:
    return [future for futures in asked.values() for future in futures if not future.done()]
