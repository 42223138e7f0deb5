"""Event-stream readers are bounded per user and per message, across replicas (``RateLimited`` past the cap).

Each ``GET .../events`` takes one slot of the user's and one of the message's (``Broker.acquire_slot``,
with a TTL) before its response starts, keeps them while it streams (refreshed in the background),
and gives them back when the stream ends. A replica that dies leaves its slots to expire within
``READER_SLOT_TTL``.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

from oasst_inference_server.broker import Broker
from oasst_inference_server.domain_errors import RateLimited
from oasst_inference_server.settings import Settings

READER_SLOT_TTL = 60.0
_RETRY_AFTER = 5  # seconds
_PROBE_TTL = 5.0  # seconds a probe's slot would live if it were not given back


class ReaderLease:
    """The two slots of one reader; ``held()`` keeps them alive for the life of the stream."""

    def __init__(self, broker: Broker, names: list[tuple[str, int]]) -> None:
        self._broker = broker
        self._names = names
        self.holder = uuid.uuid4().hex

    async def _take(self) -> str | None:
        """Take every slot, or none: the name of the full one. One broker call for all of them."""
        return await self._broker.acquire_slots(self._names, self.holder, READER_SLOT_TTL)

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(READER_SLOT_TTL / 3)
            for name, limit in self._names:
                await self._broker.acquire_slot(name, self.holder, limit, READER_SLOT_TTL)

    async def release(self) -> None:
        with contextlib.suppress(Exception):  # the slots expire by themselves if the broker is away
            await self._broker.release_slots([name for name, _ in self._names], self.holder)

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        refresher = asyncio.create_task(self._refresh(), name=f"reader-slots-{self.holder[:8]}")
        try:
            yield
        finally:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await refresher
            await self.release()


def _message_slot(message_id: str) -> str:
    return f"sse-message:{message_id}"


async def resumed_readers(broker: Broker, message_id: str) -> bool:
    """Whether any reader holds a slot of the message now, on any replica. Asked by taking the slot with
    a limit of one (refused while another holder has one) and giving it back at once."""
    probe = f"probe-{uuid.uuid4().hex}"
    free = await broker.acquire_slot(_message_slot(message_id), probe, 1, _PROBE_TTL)
    if free:
        await broker.release_slot(_message_slot(message_id), probe)
    return not free


async def acquire_reader(broker: Broker, settings: Settings, user_id: str, message_id: str) -> ReaderLease:
    """A reader's slots, or ``RateLimited`` naming the cap it met."""
    lease = ReaderLease(
        broker,
        [
            (f"sse-user:{user_id}", settings.max_sse_readers_per_user),
            (_message_slot(message_id), settings.max_sse_readers_per_message),
        ],
    )
    full = await lease._take()
    if full is not None:
        per_user = full.startswith("sse-user:")
        limit = settings.max_sse_readers_per_user if per_user else settings.max_sse_readers_per_message
        raise RateLimited(
            "too_many_readers",
            f"{limit} event streams are already open {'for you' if per_user else 'on this message'}: "
            "close one first",
            retry_after=_RETRY_AFTER,
        )
    return lease
