"""Many event streams in one blocking XREAD, on a connection of its own.

The stream fan-out of a server process reads all the streams its SSE readers follow with this reader,
one ``XREAD BLOCK ... STREAMS k1 k2 ... id1 id2 ...`` at a time, so a batch of tokens for twenty
answers costs one round trip and one reply, not twenty. When the set of streams changes while the
XREAD waits, :meth:`RedisStreamsReader.wake` ends the wait with ``CLIENT UNBLOCK`` (sent on another
connection of the pool), and the next read names the new set.

The connection is taken from the broker's pool once and kept; after an error it is dropped, and the
next read takes a new one (and asks its client id again, for ``CLIENT UNBLOCK``). On a plain
``redis://`` URL it is a bare connection of its own (:mod:`.redis_wire`): at the model's pace every
token wakes this read, and redis-py's machinery per command cost more than the rest of the read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Protocol

from loguru import logger
from redis.exceptions import RedisError

from oasst_inference_server.broker.base import BrokerError, StreamEntry, StreamsReader
from oasst_inference_server.broker.keys import RedisKeys, parse_stream_id
from oasst_inference_server.broker.redis_replies import ms, stream_entries, translated
from oasst_inference_server.broker.redis_wire import RespWire, WireClosed, WireReplyError
from oasst_inference_server.broker.xread_command import XreadCommand


class _RedisOwner(Protocol):
    """What the reader uses of the Redis broker that owns it (``redis.RedisBroker``)."""

    keys: RedisKeys
    _max_block: float
    _pool: Any
    _client: Any

    def new_wire(self) -> RespWire | None: ...


# While a read is under way but not yet blocked in Redis, CLIENT UNBLOCK finds nothing to unblock:
# it is sent again after this pause until it lands or the read has ended.
_UNBLOCK_RETRY_SECONDS = 0.001


class RedisStreamsReader(StreamsReader):
    def __init__(self, broker: _RedisOwner) -> None:
        self._broker = broker
        self._connection: Any = None
        self._client_id: int | None = None
        self._reading = 0  # the number of the read under way (0: none)
        self._reads = 0
        self._woken = False
        self._unblocking: asyncio.Task[None] | None = None
        self._wire = broker.new_wire()
        self._wire_connection = 0  # the wire's connection whose client id is _client_id
        self._xread = XreadCommand(broker.keys)

    async def read(
        self, after: Mapping[str, str | None], timeout: float, count: int = 512
    ) -> dict[str, list[StreamEntry]]:
        broker = self._broker
        if self._wire is not None:
            return await self._read_wire(self._wire, after, timeout, count)
        streams = {broker.keys.stream(stream): stream for stream in after}
        ids = ["0-0" if a is None else str(parse_stream_id(a)) for a in after.values()]
        with translated("XREAD streams"):
            connection = await self._connect()
            # From here to the send, nothing awaits: a wake() either comes before (this read does not
            # wait) or finds the read under way (and unblocks it).
            woken, self._woken = self._woken, False
            command: list[Any] = ["XREAD", "COUNT", max(1, count)]
            if timeout > 0 and not woken:
                command += ["BLOCK", ms(min(timeout, broker._max_block))]
            command += ["STREAMS", *streams, *ids]
            self._reads += 1
            self._reading = self._reads
            try:
                await connection.send_command(*command)
                reply = await connection.read_response()
            except BaseException:
                await self._drop()
                raise
            finally:
                self._reading = 0
        found: dict[str, list[StreamEntry]] = {}
        for key, entries in reply or ():
            found[streams[key]] = stream_entries([[key, entries]])
        return found

    async def _read_wire(
        self, wire: RespWire, after: Mapping[str, str | None], timeout: float, count: int
    ) -> dict[str, list[StreamEntry]]:
        xread = self._xread
        try:
            await wire.connect()
            if self._client_id is None or self._wire_connection != wire.connections:
                self._client_id = None
                client_id = int(await wire.call("CLIENT", "ID", reconnect=False))
                self._client_id, self._wire_connection = client_id, wire.connections
            # From here to the send, nothing awaits (as above).
            woken, self._woken = self._woken, False
            block = ms(min(timeout, self._broker._max_block)) if timeout > 0 and not woken else None
            command = xread.pack(after, max(1, count), block)
            self._reads += 1
            self._reading = self._reads
            try:
                reply = await wire.call_packed(command, reconnect=False)  # on the connection of _client_id
            finally:
                self._reading = 0
        except (WireClosed, WireReplyError) as exc:
            wire.drop()
            self._client_id = None
            raise BrokerError(f"redis XREAD streams failed: {type(exc).__name__}: {exc}") from exc
        except BaseException:
            wire.drop()  # cut short: its reply would come to the next read
            self._client_id = None
            raise
        stream_of_key = xread.stream_of_key
        found: dict[str, list[StreamEntry]] = {}
        for key, entries in reply or ():
            found[stream_of_key[key]] = stream_entries([[key, entries]])
        return found

    def wake(self) -> None:
        self._woken = True  # the next read does not wait, whatever happens to this one
        if self._reading and self._unblocking is None:
            self._unblocking = asyncio.create_task(self._unblock(self._reading))

    async def close(self) -> None:
        if self._unblocking is not None:
            self._unblocking.cancel()
        if self._wire is not None:
            await self._wire.close()
        await self._drop()

    async def _connect(self) -> Any:
        if self._connection is None:
            connection = await self._broker._pool.get_connection()
            try:
                await connection.send_command("CLIENT", "ID")
                self._client_id = int(await connection.read_response())
            except BaseException:
                await connection.disconnect()
                await self._broker._pool.release(connection)
                raise
            self._connection = connection
        return self._connection

    async def _drop(self) -> None:
        connection, self._connection, self._client_id = self._connection, None, None
        if connection is not None:
            # A read cut short leaves its reply unread on the socket: the connection is not reusable.
            await connection.disconnect()
            await self._broker._pool.release(connection)

    async def _unblock(self, read: int) -> None:
        try:
            while self._reading == read:
                client_id = self._client_id
                if client_id is not None and await self._broker._client.client_unblock(client_id):
                    return
                await asyncio.sleep(_UNBLOCK_RETRY_SECONDS)
        except (RedisError, OSError) as exc:  # the read still ends by its block time
            logger.debug("CLIENT UNBLOCK failed: {}", exc)
        finally:
            self._unblocking = None
