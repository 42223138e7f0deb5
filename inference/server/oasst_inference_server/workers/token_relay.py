"""Relaying a worker's tokens to the broker in batches.

A worker connection hands each token to :meth:`TokenRelay.add` and goes on reading frames; one task
writes what has accumulated with a single :meth:`Broker.append_events` call, and while that write is
in flight the next tokens gather for the following one. One token at a time costs a broker round trip
per token; under load this turns many round trips into one, with no timer and no added delay (a lone
token is written at once).

Order is kept per connection, so per message. Before anything else is appended to a message's stream
(its terminal event, a retry), the connection calls :meth:`flush`, so the terminal event comes after
every token. A broker error loses the tokens of that write for live readers only (the finished
message in the database has the whole text), as a failed single append did before.

Backpressure: past ``max_pending`` waiting tokens, :meth:`add` waits for the writer, which stops the
connection reading the websocket and so slows the worker instead of growing memory without bound.
"""

from __future__ import annotations

import asyncio

from loguru import logger

from oasst_inference_server import events
from oasst_inference_server.broker import Broker, BrokerError

DEFAULT_MAX_PENDING = 4096


class TokenRelay:
    def __init__(self, broker: Broker, *, max_pending: int = DEFAULT_MAX_PENDING, label: str = "") -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        self._broker = broker
        self._max_pending = max_pending
        self._label = label
        self._pending: list[tuple[str, str]] = []
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._room = asyncio.Event()
        self._room.set()
        self.lost = 0  # tokens a broker error kept from live readers

    async def add(self, message_id: str, text: str, logprobs: list[dict[str, object]] | None = None) -> None:
        """Queue one token of ``message_id`` for its stream; waits only while the backlog is full."""
        while len(self._pending) >= self._max_pending:
            self._room.clear()
            await self._room.wait()
        self._pending.append((events.stream_name(message_id), events.token_event(text, logprobs)))
        self._idle.clear()
        self._wakeup.set()

    async def flush(self) -> None:
        """Return once every token added so far has been written (or lost to a broker error)."""
        await self._idle.wait()

    async def write_pending(self) -> None:
        """Write what still waits, once the writer task has stopped (the connection's end): a release
        that follows reads the streams whole (continuation)."""
        batch, self._pending = self._pending, []
        self._room.set()
        if batch:
            await self._write(batch)
        self._idle.set()

    async def run(self) -> None:
        """The writer task; runs for the life of the connection."""
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            batch, self._pending = self._pending, []
            self._room.set()
            if batch:
                await self._write(batch)
            if not self._pending:
                self._idle.set()

    async def _write(self, batch: list[tuple[str, str]]) -> None:
        try:
            await self._broker.append_events(batch)
        except BrokerError as exc:
            # Readers miss these tokens; the finished message (in the database) has them.
            self.lost += len(batch)
            logger.warning("{} tokens{} not relayed: {}", len(batch), self._label, exc)
