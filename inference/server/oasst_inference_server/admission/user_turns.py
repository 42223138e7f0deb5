"""One submission at a time per user, where the database cannot serialize them itself (SQLite).

The limits of :mod:`.rate_limit` count the user's generations in the database, so two of the user's
requests checked at the same moment would both see room for one more. On Postgres the check locks the
user's row until the submission commits. SQLite has no row locks, and a transaction there takes its
write lock only at its first write; but a server on SQLite is one process (the settings refuse more), so
a lock per user in that process serializes the submissions just as well: a submission takes its user's
turn before its transaction's first write and gives it back once it committed or failed.

The turn must be taken before the first write: a request that waited for the turn holding SQLite's
write lock (a staged prompt, flushed) would keep the holder from committing until the busy timeout.
Nor may a waiter hold a pooled connection (its session read the user, the chat): twenty requests of one
user at once would hold the whole pool while the one with the turn waits for a connection, until the
pool's timeout answered them 503. A request that must wait ends its read-only transaction first, which
gives its connection back (the session's objects stay loaded: it does not expire them on commit).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.db.engine import end_read


class _Turn:
    __slots__ = ("lock", "holders")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.holders = 0  # the submissions holding or waiting for this turn


class UserTurns:
    """Per-user locks of one process; ``enabled`` False (Postgres): every turn is granted at once."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self._turns: dict[str, _Turn] = {}

    @asynccontextmanager
    async def turn(self, user_id: str, session: AsyncSession | None = None) -> AsyncIterator[None]:
        """Hold ``user_id``'s turn for the block; released however the block ends (an error, a
        cancellation), and forgotten once nobody holds or waits for it. ``session``: the caller's, whose
        connection goes back to the pool while the turn is waited for (if it has nothing unwritten)."""
        if not self.enabled:
            yield
            return
        entry = self._turns.get(user_id)
        if entry is None:
            entry = self._turns[user_id] = _Turn()
        entry.holders += 1
        try:
            if entry.holders > 1 and session is not None:
                await end_read(session)  # a read-only transaction ends: its connection goes back
            async with entry.lock:
                yield
        finally:
            entry.holders -= 1
            if entry.holders == 0:
                del self._turns[user_id]

    def held(self) -> int:
        """Users whose turn is held or waited for (for tests: nothing leaks)."""
        return len(self._turns)
