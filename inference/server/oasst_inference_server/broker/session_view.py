"""This process's view of the worker sessions of all replicas, read at most once per ``max_age``.

Every request asks which models are live; with a thousand workers, reading and validating all their
session records per request cost more than the request itself. A :class:`WorkerSessionView` keeps the
last read and re-reads when

* it is older than ``max_age`` seconds (a worker that connects to or leaves another replica shows here
  within that bound), or
* this process put a new session or removed one (:attr:`.base.Broker.local_session_changes`): a worker
  of this replica shows at once, and is gone at once when it leaves, or
* the caller asks for a fresh read (``fresh=True``: say, before answering that no worker serves a model).

Callers waiting at the same time share one read. A record whose bytes did not change since the last
read keeps its parsed :class:`.worker_session.WorkerSession` (its records change with every pong that
reports new capacity, the rest of the time they do not). The sessions handed out are shared: read them,
never change them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from oasst_inference_server.broker.base import Broker
from oasst_inference_server.broker.worker_session import WorkerSession

DEFAULT_MAX_AGE = 1.0


@dataclass(frozen=True)
class SessionSnapshot:
    """The sessions of one read: session id -> session (records this version cannot read left out)."""

    sessions: dict[str, WorkerSession]
    read_at: float  # time.monotonic() when the read started
    local_changes: int  # the broker's local_session_changes when the read started


class WorkerSessionView:
    def __init__(self, broker: Broker, max_age: float = DEFAULT_MAX_AGE):
        self.broker = broker
        self.max_age = max_age
        self._snapshot: SessionSnapshot | None = None
        self._reading: asyncio.Task[SessionSnapshot] | None = None
        # Per session id: the record's data as last read and what it parsed to.
        self._parsed: dict[str, tuple[str, WorkerSession | None]] = {}

    async def snapshot(self, *, fresh: bool = False) -> SessionSnapshot:
        """The sessions as of at most ``max_age`` ago (read after this call with ``fresh``). Raises the
        broker's error if they cannot be read."""
        asked_at = time.monotonic()
        snapshot = self._snapshot
        while snapshot is None or not (
            snapshot.read_at >= asked_at or (not fresh and self._current(snapshot))
        ):
            # ``_reading`` is a read under way: it clears itself before it returns.
            reading = self._reading
            if reading is None:
                reading = self._reading = asyncio.create_task(self._read(), name="worker session view")
            # Shielded: one caller giving up (a client that went away) must not cancel the others' read.
            # A read that started before this call and is stale already is followed by one more.
            snapshot = await asyncio.shield(reading)
        return snapshot

    def latest(self) -> SessionSnapshot | None:
        """The last read, however old (no read is made): for checks on a hot path that may be wrong for
        a moment."""
        return self._snapshot

    async def sessions(self, *, fresh: bool = False) -> list[WorkerSession]:
        return list((await self.snapshot(fresh=fresh)).sessions.values())

    def _current(self, snapshot: SessionSnapshot) -> bool:
        return (
            snapshot.local_changes == self.broker.local_session_changes
            and time.monotonic() - snapshot.read_at < self.max_age
        )

    async def _read(self) -> SessionSnapshot:
        try:
            snapshot = await self._read_sessions()
        finally:
            if self._reading is asyncio.current_task():
                self._reading = None
        if self._snapshot is None or snapshot.read_at >= self._snapshot.read_at:
            self._snapshot = snapshot
        return snapshot

    async def _read_sessions(self) -> SessionSnapshot:
        read_at, local_changes = time.monotonic(), self.broker.local_session_changes
        records = await self.broker.list_worker_sessions()
        # This process's sessions missing from the read are written again at their next pong.
        self.broker.note_sessions_read([record.session_id for record in records])
        parsed: dict[str, tuple[str, WorkerSession | None]] = {}
        sessions: dict[str, WorkerSession] = {}
        for record in records:
            known = self._parsed.get(record.session_id)
            if known is not None and known[0] == record.data:
                session = known[1]
            else:
                session = WorkerSession.of(record)
            parsed[record.session_id] = (record.data, session)
            if session is not None:
                sessions[record.session_id] = session
        self._parsed = parsed  # sessions gone since the last read are forgotten
        return SessionSnapshot(sessions, read_at, local_changes)
