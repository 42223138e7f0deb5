"""Lease extensions: every pong of a worker that holds messages extends their leases.

One transaction per pong was 200 transactions a second at 1,000 workers (one ping each 5 s) before any
request, enough to empty the connection pool. A :class:`LeaseExtensions` of the process gathers the
pongs of all its workers and extends their leases in one statement per ``interval`` (a fraction of the
ping interval and of the lease), then tells each worker's connection which messages it should stop
(:func:`to_stop`): the lease of a message is extended at most ``interval`` plus one statement after the
pong, far inside ``lease_seconds``.

Failure semantics are those of one transaction per pong: a worker that stops answering pings asks for
no extension, so its leases expire; a statement that fails (the database is down) is logged and
dropped, and the next pongs ask again (the leases outlast a short outage); a session that has ended
(:meth:`LeaseExtensions.forget`) is not extended.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Collection, Iterable
from datetime import timedelta

from loguru import logger
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.db.models import DbMessage, utcnow
from oasst_inference_server.settings import Settings
from oasst_shared.schemas import MessageState

# Sessions per statement: well inside every database's limit of bound parameters.
_SESSIONS_PER_STATEMENT = 500

# Called with the messages a worker should stop (see to_stop); only when there are any.
OnStop = Callable[[list[str]], Awaitable[None]]

# Per session: the messages it owns in progress, each with whether its cancel was requested.
Owned = dict[str, list[tuple[str, bool]]]


async def extend(session: AsyncSession, session_ids: Iterable[str], lease_seconds: float) -> Owned:
    """Extend by ``lease_seconds`` from now the leases of the in-progress messages the sessions own, each
    statement committed: a transaction of two statements would hold the first one's rows while it locks
    the second one's, out of the order of their ids (a deadlock with the answers' ends at
    ``bench.many_streams``' burst)."""
    ids = sorted(set(session_ids))
    owned: Owned = {session_id: [] for session_id in ids}
    deadline = utcnow() + timedelta(seconds=lease_seconds)
    for start in range(0, len(ids), _SESSIONS_PER_STATEMENT):
        # The rows locked in the order of their ids first, as every statement that changes several
        # messages locks them (``answer_ends`` too): two never wait for each other crosswise (deadlock).
        held = (
            select(DbMessage.id)
            .where(
                DbMessage.worker_session_id.in_(ids[start : start + _SESSIONS_PER_STATEMENT]),
                DbMessage.state == MessageState.in_progress,
            )
            .order_by(DbMessage.id)
            .with_for_update()
        )
        rows = await session.exec(
            update(DbMessage)
            .where(DbMessage.id.in_(held), DbMessage.state == MessageState.in_progress)
            .values(lease_deadline=deadline)
            .returning(DbMessage.id, DbMessage.worker_session_id, DbMessage.cancel_requested)
        )
        for message_id, session_id, cancel_requested in rows.all():
            owned[session_id].append((message_id, bool(cancel_requested)))
        await session.commit()
    return owned


def lease_interval(settings: Settings) -> float:
    """How long pongs gather before their statement: a fifth of the ping interval, a tenth of the
    lease, at most a second."""
    return min(1.0, settings.worker_ping_interval / 5, settings.lease_seconds / 10)


def to_stop(owned: list[tuple[str, bool]], holding: Collection[str]) -> list[str]:
    """The messages a worker should stop: those it owns whose cancel is still pending, and those of
    ``holding`` (what its connection believes it runs) that it no longer owns (cancelled, expired,
    moved on). The connection sends their cancel again until the worker acknowledges it with a result."""
    ids = {message_id for message_id, _ in owned}
    return [message_id for message_id, cancelled in owned if cancelled] + [
        message_id for message_id in holding if message_id not in ids
    ]


class LeaseExtensions:
    def __init__(
        self,
        session_factory: async_sessionmaker[AsyncSession],
        *,
        lease_seconds: float,
        interval: float,
    ):
        self._sessions = session_factory
        self._lease_seconds = lease_seconds
        self.interval = interval
        # Asked since the last statement: session id -> (the messages its connection holds, callback).
        self._asked: dict[str, tuple[frozenset[str], OnStop]] = {}
        self._runner: asyncio.Task[None] | None = None
        self._callbacks: set[asyncio.Task[None]] = set()

    def extend_soon(self, session_id: str, holding: Collection[str], on_stop: OnStop) -> None:
        """Extend the leases of the session's messages within ``interval``; then ``on_stop`` gets the
        messages its worker should stop (:func:`to_stop` of ``holding``), if there are any. A later
        call for the same session before the statement replaces this one."""
        self._asked[session_id] = (frozenset(holding), on_stop)
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run(), name="lease extensions")

    def forget(self, session_id: str) -> None:
        """The session has ended: do not extend its leases any more."""
        self._asked.pop(session_id, None)

    async def close(self) -> None:
        for task in [self._runner, *self._callbacks]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _run(self) -> None:
        # Ends when a statement found nothing new asked: started again by the next extend_soon.
        while self._asked:
            await asyncio.sleep(self.interval)
            await self.flush()

    async def flush(self) -> None:
        """One statement for every session asked so far."""
        asked, self._asked = self._asked, {}
        if not asked:
            return
        try:
            async with self._sessions() as session:
                owned = await extend(session, asked, self._lease_seconds)
                await session.commit()
        except Exception as exc:  # the database is down: the leases outlast a short outage
            logger.warning("leases of {} workers not extended: {}: {}", len(asked), type(exc).__name__, exc)
            return
        for session_id, (holding, on_stop) in asked.items():
            stop = to_stop(owned.get(session_id, []), holding)
            if stop:
                task = asyncio.create_task(self._tell(session_id, on_stop, stop))
                self._callbacks.add(task)
                task.add_done_callback(self._callbacks.discard)

    @staticmethod
    async def _tell(session_id: str, on_stop: OnStop, stop: list[str]) -> None:
        try:
            await on_stop(stop)
        except Exception as exc:  # the socket closed meanwhile: its connection ends on its own
            logger.debug("worker {}: cancels not re-sent: {}: {}", session_id, type(exc).__name__, exc)
