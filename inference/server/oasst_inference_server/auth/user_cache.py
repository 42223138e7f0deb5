"""The users that access tokens name, kept for a few seconds so a request costs no user lookup.

An access token is verified from its signature alone; the user's state that decides whether it is
still good (deleted, token generation) and what it may do (tier) comes from the database. This cache
keeps that state per user for ``user_cache_seconds``, at most ``user_cache_size`` users (the least
recently used go first). A change made through this process (``forget``) is seen at once; a change made
through another process or replica is seen once the entry expires, so a revoked token or a deleted
user is refused everywhere within ``user_cache_seconds``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from sqlalchemy.orm import make_transient_to_detached
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.db.models import DbUser


class UserCache:
    def __init__(self, ttl: float, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self.clock = clock
        # user id -> (expiry, a detached copy no session ever changes)
        self._entries: OrderedDict[str, tuple[float, DbUser]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, user_id: object) -> bool:
        return user_id in self._entries

    async def get(self, session: AsyncSession, user_id: str) -> DbUser | None:
        """The user ``user_id`` attached to ``session`` (as ``session.get`` gives it), from the cache
        while its entry is fresh."""
        entry = self._entries.get(user_id)
        if entry is not None:
            expiry, snapshot = entry
            if self.clock() < expiry:
                self._entries.move_to_end(user_id)
                # A copy of the snapshot in the session, with no query: the request may change it.
                return await session.merge(snapshot, load=False)
            del self._entries[user_id]
        user = await session.get(DbUser, user_id)
        if user is not None and self.ttl > 0:
            self._remember(user)
        return user

    def forget(self, user_id: str) -> None:
        """Drop the user's entry: this process changed the user."""
        self._entries.pop(user_id, None)

    def _remember(self, user: DbUser) -> None:
        snapshot = DbUser.model_validate(user.model_dump())
        make_transient_to_detached(snapshot)
        self._entries[user.id] = (self.clock() + self.ttl, snapshot)
        self._entries.move_to_end(user.id)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
