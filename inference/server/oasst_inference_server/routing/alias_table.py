"""Each replica's view of the aliases: the files' ones with the stored ones over them, read again from
the database as soon as any replica (or the CLI) announces a change.

A change is announced by appending an entry to one broker stream after the database commit. Before it
uses its view, a replica asks the broker for entries newer than the last it saw (one non-blocking read):
if there is one, it reads the aliases again, so a request that reaches any replica after the change was
answered sees it. The database read comes after the broker read, so it holds at least the change the
entry announced. Redis holds nothing that cannot be rebuilt: if the stream is lost (a flush) or the
broker cannot be reached, the view is read again once it is ``alias_cache_seconds`` old: in the
background, the requests of that moment served the view as it was.

The requests of one moment share one database read: a read that began after a request's broker read
serves it too. Each request reading in turn (on a session of its own, maybe holding its own request's
connection meanwhile) emptied the connection pool under load.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from loguru import logger
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.broker import Broker, BrokerError
from oasst_inference_server.routing.alias_store import stored_aliases
from oasst_shared.model_routes import ModelRoute

CHANGES_STREAM = "model-aliases"
API = "api"


@dataclass(frozen=True)
class AliasEntry:
    route: ModelRoute
    # "api" (stored), or the model-config file that declares it
    source: str
    updated_at: datetime | None = None


async def announce_change(broker: Broker, alias: str) -> None:
    """Tell every replica that the stored aliases changed (call after the commit)."""
    await broker.append_event(CHANGES_STREAM, json.dumps({"alias": alias}))


class AliasTable:
    def __init__(
        self,
        session_factory: async_sessionmaker[AsyncSession],
        broker: Broker,
        file_aliases: Mapping[str, AliasEntry],
        max_age: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sessions = session_factory
        self._broker = broker
        self.file_aliases = dict(file_aliases)
        self._max_age = max_age
        self._clock = clock
        self._aliases: dict[str, AliasEntry] = dict(file_aliases)
        self._read_at: float | None = None
        self._seen: str | None = None  # the newest change entry this view includes
        self._lock = asyncio.Lock()
        # Database reads begun, and the number of the newest one that completed: a caller that needs a
        # read is served by any read that began after it asked, so callers at one moment share one.
        self._reads_begun = 0
        self._read_done = 0
        self._refresh: asyncio.Task[None] | None = None  # the backstop's read in the background, kept

    async def current(self) -> Mapping[str, AliasEntry]:
        """Every alias by name, as of the newest change any replica announced."""
        newest = await self._newest_change()
        asked = self._reads_begun  # after the broker read: a read begun from here on has what it saw
        if newest is not None:
            await self._read_once(newest, after=asked)
        elif self._read_at is None:
            await self._read_once(None)  # the first view: any read will do
        elif self._clock() - self._read_at >= self._max_age and (
            self._refresh is None or self._refresh.done()
        ):
            # Only the backstop for a change the broker lost: read in the background, the requests
            # of the moment served from the view as it is rather than waiting for the read.
            self._refresh = asyncio.create_task(self._refresh_quietly(asked), name="alias view refresh")
        return self._aliases

    async def _read_once(self, newest: str | None, after: int | None = None) -> None:
        """Read the aliases unless a read completed meanwhile that serves: with ``after``, one begun
        after the caller's broker read (so after the commit of the change it saw); without, any. Many
        callers at once make one read, not one each in turn, each holding a request's place (and
        maybe a pooled connection) while it waits."""
        async with self._lock:
            if self._read_done > after if after is not None else self._read_at is not None:
                return
            self._reads_begun += 1
            number = self._reads_begun
            await self._read(newest)
            self._read_done = number

    async def _refresh_quietly(self, asked: int) -> None:
        try:
            await self._read_once(None, after=asked)
        except Exception as exc:  # the view stays as it is; the next request past the age tries again
            logger.warning("aliases not read again: {}: {}", type(exc).__name__, exc)

    async def _newest_change(self) -> str | None:
        try:
            entries = await self._broker.read_events(CHANGES_STREAM, self._seen, timeout=0, count=512)
        except BrokerError as exc:
            logger.warning("alias changes unreadable ({}); aliases read again every {} s", exc, self._max_age)
            return None
        return entries[-1].id if entries else None

    async def _read(self, newest: str | None) -> None:
        async with self._sessions() as session:
            rows = await stored_aliases(session)
        aliases = dict(self.file_aliases)
        for row in rows:
            route = ModelRoute(model=row.model_config_name, fallbacks=list(row.fallbacks or []))
            aliases[row.alias] = AliasEntry(route, API, row.updated_at)
        self._aliases = aliases
        self._read_at = self._clock()
        if newest is not None:
            self._seen = newest
