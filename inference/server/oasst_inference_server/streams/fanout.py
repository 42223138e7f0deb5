"""One broker read per server process for every stream its readers follow, fanned out in memory.

Each SSE reader used to run its own blocking read of the message's stream, so k readers of one answer
cost k broker round trips per token, and n answers n reads. Here a reader subscribes to
:class:`StreamFanout`; the first subscriber of a stream starts that stream's *feed*, its position in
the stream and its subscribers. One task per process reads every feed's stream in one broker read
(:class:`~oasst_inference_server.broker.StreamsReader`: one blocking ``XREAD`` of all the streams on
Redis) and copies every entry it gets into the buffer of each subscriber of that stream, without
waiting for any of them. A new feed wakes the read under way, so the next read names its stream too.

A subscriber returns the entries strictly after its own cursor (its ``Last-Event-ID``, then the last
entry it returned), exactly once and in order:

* until it is in a feed, it reads what is stored from the broker itself, at its own pace (a reader that
  attached late, resumes from an older id, or fell behind catches up as every reader did before the
  fan-out); once a read finds it near the end of the stream, it joins the stream's feed, starting one
  if there is none. A feed only follows the end of a stream: it never reads a backlog for anyone;
* when it joins a feed that has already read past its cursor, it first reads the part in between
  from the broker, up to the feed's position when it joined, then continues from its buffer; entries
  the feed read up to the cursor are skipped;
* its buffer is bounded: a subscriber ``buffer_limit`` entries behind (its client reads slowly) is cut
  off and its buffer dropped, so it holds up nobody and costs no more memory; its next read catches up
  from the broker as above;
* a feed ends after the stream's terminal event, or on a broker error (each subscriber then raises
  that error once, after what it had buffered, and catches up on its next read), or when its last
  subscriber leaves; entries a read brought for a feed that ended or started again meanwhile are not
  handed on (the broker still has them for whoever reads next).

Above the broker interface, so the Redis and the in-process broker both get it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator

from loguru import logger

from oasst_inference_server import events
from oasst_inference_server.broker import Broker, BrokerError, StreamEntry, StreamId, parse_stream_id

BUFFER_LIMIT = 2048  # entries a subscriber may fall behind its feed before it is detached
READ_COUNT = 512  # entries per broker read, and at most per batch a subscriber returns
_FEED_BLOCK = 10.0  # seconds one blocking read of a feed waits before it reads again
_START = StreamId(0, 0)  # before every entry: "read from the beginning"


class _Feed:
    """The one reader of a stream in this process, and the subscribers it copies entries to."""

    def __init__(self, stream: str, position: str | None) -> None:
        self.stream = stream
        self.position = position  # the id of the last entry read (None: none yet, from the start)
        self.position_id = _START if position is None else parse_stream_id(position)
        self.read_any = False  # until then, position is only its first subscriber's cursor
        self.subscribers: set[Subscription] = set()


class Subscription:
    """One reader's view of a stream: :meth:`read` returns the entries after its cursor."""

    def __init__(self, fanout: StreamFanout, stream: str, after: str | None) -> None:
        self._fanout = fanout
        self.stream = stream
        self.cursor = after  # the id of the last entry returned (or the reader's Last-Event-ID)
        self._cursor_id = _START if after is None else parse_stream_id(after)
        self._buffer: deque[StreamEntry] = deque()
        self._feed: _Feed | None = None
        self._missed_until: StreamId | None = None  # entries up to here come from the broker itself
        self._skip_through: StreamId | None = None  # buffered entries up to here were already returned
        self._error: BrokerError | None = None
        self._waiter: asyncio.Future[None] | None = None  # set while read() waits for the feed
        self.detached = 0  # times this subscriber fell too far behind and was cut from its feed

    async def read(self, timeout: float) -> list[StreamEntry]:
        """Entries after the cursor, oldest first, as :meth:`Broker.read_events` returns them: at once
        when there are any, else after waiting up to ``timeout`` seconds (empty if none came).

        Raises ``BrokerError`` when the feed failed and this subscriber had nothing left to return.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self._feed is None and not self._buffer:
                if self._error is not None:
                    error, self._error = self._error, None
                    raise error
                if self._fanout.closed:
                    raise BrokerError("the server is shutting down")
                # Not in a feed: read what is stored, at our own pace, until we are near its end. A
                # feed only ever follows the end of a stream, so it never runs ahead of a reader
                # that is catching up.
                stored = await self._fanout.broker.read_events(
                    self.stream, self.cursor, timeout=0, count=READ_COUNT
                )
                if stored:
                    self._advance(stored)
                if len(stored) < READ_COUNT and not any(events.is_terminal(entry.data) for entry in stored):
                    self._join()
                if stored:
                    return stored
            if self._missed_until is not None:
                missed = await self._read_missed()
                if missed:
                    return self._advance(missed)
                continue
            taken = self._take_buffered()
            if taken:
                return self._advance(taken)
            if self._feed is None:
                continue  # the feed ended or cut us off: catch up and join again (or raise its error)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            # A bare future and a timer rather than wait_for: this runs for every batch of every reader.
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(remaining, _resolve, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None

    def _join(self) -> None:
        feed = self._fanout._feed_for(self.stream, self.cursor)
        feed.subscribers.add(self)
        self._feed = feed
        # The feed may have read past our cursor already (the broker still has what it read), or not
        # reached it yet (what it reads up to the cursor is skipped).
        self._missed_until = feed.position_id if feed.position_id > self._cursor_id else None
        self._skip_through = self._cursor_id if feed.position_id < self._cursor_id else None

    async def _read_missed(self) -> list[StreamEntry]:
        """Entries after the cursor up to where the feed was when we joined, read from the broker."""
        until = self._missed_until
        assert until is not None
        entries = await self._fanout.broker.read_events(self.stream, self.cursor, timeout=0, count=READ_COUNT)
        missed = [entry for entry in entries if parse_stream_id(entry.id) <= until]
        done = (
            len(missed) < len(entries)
            or len(entries) < READ_COUNT
            or (missed and parse_stream_id(missed[-1].id) == until)
        )
        if done:
            self._missed_until = None
        return missed

    def _take_buffered(self) -> list[StreamEntry]:
        buffer = self._buffer
        if self._skip_through is not None:
            while buffer and parse_stream_id(buffer[0].id) <= self._skip_through:
                buffer.popleft()
            if not buffer:
                return []
            self._skip_through = None
        if len(buffer) <= READ_COUNT:
            taken = list(buffer)
            buffer.clear()
            return taken
        return [buffer.popleft() for _ in range(READ_COUNT)]

    def _advance(self, entries: list[StreamEntry]) -> list[StreamEntry]:
        self.cursor = entries[-1].id
        self._cursor_id = parse_stream_id(self.cursor)
        return entries

    # ------------------------------------------------------------ called by the feed, never awaiting
    def _deliver(self, entries: list[StreamEntry], limit: int) -> bool:
        """Buffer ``entries``; False (and nothing buffered) when that would pass ``limit``."""
        if len(self._buffer) + len(entries) > limit:
            return False
        self._buffer.extend(entries)
        self._wake()
        return True

    def _cut_off(self) -> None:
        """Too far behind: drop the buffer; the next read catches up from the broker."""
        self._buffer.clear()
        self._feed = None
        self._missed_until = None
        self._skip_through = None
        self.detached += 1
        self._wake()

    def _feed_ended(self, error: BrokerError | None) -> None:
        self._feed = None
        self._error = error
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None:
            _resolve(self._waiter)

    def _leave(self) -> None:
        feed, self._feed = self._feed, None
        if feed is not None:
            self._fanout._unsubscribe(feed, self)


class StreamFanout:
    """The feeds of this server process, all read by one broker read loop."""

    def __init__(self, broker: Broker, *, buffer_limit: int = BUFFER_LIMIT) -> None:
        if buffer_limit < READ_COUNT:
            raise ValueError(f"buffer_limit must be at least {READ_COUNT} (one broker read)")
        self.broker = broker
        self.buffer_limit = buffer_limit
        self._feeds: dict[str, _Feed] = {}
        self._reader = broker.streams_reader()
        self._task: asyncio.Task[None] | None = None
        self.closed = False

    @contextlib.asynccontextmanager
    async def subscribe(self, stream: str, after: str | None) -> AsyncIterator[Subscription]:
        """``async with fanout.subscribe(stream, last_event_id) as events: await events.read(timeout)``

        ``after`` must be a stream id (``ValueError`` otherwise) or None for the whole stream.
        """
        subscription = Subscription(self, stream, after)
        try:
            yield subscription
        finally:
            subscription._leave()

    def feeds(self) -> int:
        """How many streams this process reads now (all in one broker read)."""
        return len(self._feeds)

    async def close(self) -> None:
        """Stop every feed and the read loop (at shutdown, before the broker closes)."""
        self.closed = True
        for feed in list(self._feeds.values()):
            self._end(feed, None)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._reader.close()

    def _feed_for(self, stream: str, position: str | None) -> _Feed:
        feed = self._feeds.get(stream)
        if feed is not None and not feed.read_any:
            # Its start is only a cursor a client sent, perhaps one past anything the stream will hold:
            # a reader from further back starts the feed again from its own cursor.
            if (_START if position is None else parse_stream_id(position)) < feed.position_id:
                feed = self._restart(feed, position)
        if feed is None:
            feed = self._feeds[stream] = _Feed(stream, position)
            self._follow()
        return feed

    def _follow(self) -> None:
        """The feeds changed: start the read loop, or make its read under way end so that the next
        one reads the streams of the feeds there are now."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="stream-feeds")
        else:
            self._reader.wake()

    def _restart(self, feed: _Feed, position: str | None) -> _Feed:
        del self._feeds[feed.stream]
        fresh = self._feed_for(feed.stream, position)
        for subscription in feed.subscribers:
            # Their cursors are at or past the old start, so past the new one: skip up to them.
            subscription._feed = fresh
            subscription._skip_through = subscription._cursor_id
            fresh.subscribers.add(subscription)
        feed.subscribers = set()
        return fresh

    def _unsubscribe(self, feed: _Feed, subscription: Subscription) -> None:
        feed.subscribers.discard(subscription)
        if not feed.subscribers and self._feeds.get(feed.stream) is feed:
            del self._feeds[feed.stream]
            if not self._feeds and self._task is not None:
                self._reader.wake()  # nothing left to read: the loop ends (and frees its connection)

    def _end(self, feed: _Feed, error: BrokerError | None) -> None:
        if self._feeds.get(feed.stream) is feed:
            del self._feeds[feed.stream]
        for subscription in feed.subscribers:
            subscription._feed_ended(error)
        feed.subscribers.clear()

    async def _run(self) -> None:
        """The read loop: one broker read of every feed's stream at a time, while there are feeds."""
        try:
            while self._feeds:
                requested = dict(self._feeds)
                try:
                    found = await self._reader.read(
                        {stream: feed.position for stream, feed in requested.items()},
                        timeout=_FEED_BLOCK,
                        count=READ_COUNT,
                    )
                    for stream, entries in found.items():
                        feed = requested[stream]
                        if self._feeds.get(stream) is feed:  # else it ended or started again meanwhile
                            self._hand_on(feed, entries)
                except BrokerError as exc:
                    logger.debug("the read of {} streams stopped: {}", len(requested), exc)
                    self._end_all(requested, exc)
                except Exception as exc:  # a bug here must not leave the subscribers waiting forever
                    logger.opt(exception=exc).error("the read of {} streams failed", len(requested))
                    self._end_all(requested, BrokerError(f"reading the stream failed: {type(exc).__name__}"))
        except asyncio.CancelledError:
            self._end_all(dict(self._feeds), None)
            raise

    def _hand_on(self, feed: _Feed, entries: list[StreamEntry]) -> None:
        feed.position = entries[-1].id
        feed.read_any = True
        feed.position_id = parse_stream_id(feed.position)
        for subscription in list(feed.subscribers):
            if not subscription._deliver(entries, self.buffer_limit):
                feed.subscribers.discard(subscription)
                subscription._cut_off()
        if not feed.subscribers or any(events.is_terminal(entry.data) for entry in entries):
            self._end(feed, None)  # nobody left, or the stream is finished: nothing more will come

    def _end_all(self, feeds: dict[str, _Feed], error: BrokerError | None) -> None:
        for stream, feed in feeds.items():
            if self._feeds.get(stream) is feed:
                self._end(feed, error)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
