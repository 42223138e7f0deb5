"""The stream fan-out (``streams/fanout.py``) over both brokers: one broker read loop per stream, every
reader gets every event after its cursor exactly once and in order, a reader that stops reading delays
nobody, and a broker error reaches each reader once and is recovered from."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from oasst_inference_server import events
from oasst_inference_server.broker import Broker, BrokerError, StreamEntry, StreamsReader, stream_id_after
from oasst_inference_server.streams.fanout import READ_COUNT, StreamFanout, Subscription

BrokerFactory = Callable[..., Awaitable[Broker]]

STREAM = "events:m1"


StreamsRead = Callable[[Mapping[str, str | None], float, int], Awaitable[dict[str, list[StreamEntry]]]]


def wrap_streams_reads(
    broker: Broker,
    around: Callable[
        [StreamsRead, Mapping[str, str | None], float, int], Awaitable[dict[str, list[StreamEntry]]]
    ],
) -> None:
    """Every read of the streams readers the broker makes from now on goes through ``around``."""
    make_reader = broker.streams_reader

    class Wrapped(StreamsReader):
        def __init__(self) -> None:
            self.reader = make_reader()

        async def read(
            self, after: Mapping[str, str | None], timeout: float, count: int = 512
        ) -> dict[str, list[StreamEntry]]:
            return await around(self.reader.read, after, timeout, count)

        def wake(self) -> None:
            self.reader.wake()

        async def close(self) -> None:
            await self.reader.close()

    broker.streams_reader = Wrapped  # type: ignore[method-assign]


class ReadCounter:
    """Counts the broker's reads of one stream, and how many waiting (blocking) reads ran at once:
    the fan-out's read loop waits for the next entry (of every stream it follows, in one read); a
    reader catching up reads what is stored without waiting. Made before the fan-out it watches."""

    def __init__(self, broker: Broker, stream: str) -> None:
        self.calls = 0
        self.waiting = 0
        self.most_waiting_at_once = 0
        self.streams_per_read: list[int] = []  # of the read loop's reads
        original = broker.read_events

        async def counted(
            name: str, after: str | None, timeout: float, count: int = 512
        ) -> list[StreamEntry]:
            if name != stream:
                return await original(name, after, timeout, count)
            async with self._counting(timeout):
                return await original(name, after, timeout, count)

        async def counted_streams(
            read: StreamsRead, after: Mapping[str, str | None], timeout: float, count: int
        ) -> dict[str, list[StreamEntry]]:
            self.streams_per_read.append(len(after))
            if stream not in after:
                return await read(after, timeout, count)
            async with self._counting(timeout):
                return await read(after, timeout, count)

        broker.read_events = counted  # type: ignore[method-assign]
        wrap_streams_reads(broker, counted_streams)

    @contextlib.asynccontextmanager
    async def _counting(self, timeout: float) -> AsyncIterator[None]:
        self.calls += 1
        waits = timeout > 0
        self.waiting += waits
        self.most_waiting_at_once = max(self.most_waiting_at_once, self.waiting)
        try:
            yield
        finally:
            self.waiting -= waits


async def read_to_end(subscription: Subscription) -> list[StreamEntry]:
    """Read as an SSE reader does, up to and including the terminal event."""
    seen: list[StreamEntry] = []
    while True:
        batch = await asyncio.wait_for(subscription.read(timeout=1.0), 30)
        seen.extend(batch)
        if batch and events.is_terminal(batch[-1].data):
            return seen


async def write(broker: Broker, count: int, *, chunk: int = 1, pause: float = 0.001) -> list[str]:
    """``count`` token events in appends of ``chunk``, then the terminal event; their ids (those of
    single appends only: a batch append returns none)."""
    ids: list[str] = []
    for start in range(0, count, chunk):
        texts = [f" t{i}" for i in range(start, min(count, start + chunk))]
        if chunk == 1:
            ids.append(await broker.append_event(STREAM, events.token_event(texts[0])))
        else:
            await broker.append_events([(STREAM, events.token_event(text)) for text in texts])
        await asyncio.sleep(pause)
    ids.append(await broker.append_event(STREAM, events.error_event("the end", None), terminal=True))
    return ids


async def all_entries(broker: Broker) -> list[StreamEntry]:
    entries: list[StreamEntry] = []
    after = None
    while batch := await broker.read_events(STREAM, after, timeout=0, count=1000):
        entries.extend(batch)
        after = batch[-1].id
    return entries


async def test_readers_sharing_one_read_get_every_event_once_in_order_with_resume(broker: Broker) -> None:
    counter = ReadCounter(broker, STREAM)
    fanout = StreamFanout(broker)
    early = await broker.append_event(STREAM, events.token_event(" early"))
    results: dict[str, list[StreamEntry]] = {}
    cursors: dict[str, str | None] = {}

    async def reader(name: str, after: str | None, delay: float = 0.0) -> None:
        await asyncio.sleep(delay)
        cursors[name] = after
        async with fanout.subscribe(STREAM, after) as subscription:
            results[name] = await read_to_end(subscription)

    writer = asyncio.create_task(write(broker, 300, pause=0.002))
    readers = [reader(f"start{i}", None) for i in range(10)]
    readers += [reader(f"resume{i}", early) for i in range(5)]
    # Readers that join while the stream grows, some resuming from the middle of what was written.
    readers += [reader(f"late{i}", None, delay=0.1 + i * 0.05) for i in range(5)]

    async def resume_from_the_middle(index: int) -> None:
        await asyncio.sleep(0.2 + index * 0.05)
        written = await all_entries(broker)
        await reader(f"middle{index}", written[len(written) // 2].id)

    await asyncio.gather(writer, *readers, *(resume_from_the_middle(i) for i in range(5)))
    stored = await all_entries(broker)
    assert len(stored) == 302 and events.is_terminal(stored[-1].data)
    for name, seen in results.items():
        after = cursors[name]
        expected = stored if after is None else [e for e in stored if stream_id_after(e.id, after)]
        assert seen == expected, name
    assert len(results) == 25
    assert counter.most_waiting_at_once == 1  # one read loop, never one per reader
    assert fanout.feeds() == 0


async def test_n_readers_of_one_stream_cost_the_reads_of_one(broker: Broker) -> None:
    counter = ReadCounter(broker, STREAM)
    fanout = StreamFanout(broker)
    tokens = 100
    async with contextlib.AsyncExitStack() as stack:
        subscriptions = [await stack.enter_async_context(fanout.subscribe(STREAM, None)) for _ in range(31)]
        # Each reader's first read looks at what is stored (nothing yet), then joins the stream's feed.
        for subscription in subscriptions:
            assert await subscription.read(timeout=0) == []
        assert fanout.feeds() == 1
        joined = counter.calls  # 31, and the feed's first read if it has started
        results = await asyncio.gather(write(broker, tokens), *(read_to_end(s) for s in subscriptions))
    seen = results[1:]
    assert all(len(entries) == tokens + 1 for entries in seen)
    assert all(entries == seen[0] for entries in seen)
    # Then one read per append at most, where 31 readers reading on their own would make 31.
    assert counter.calls - joined <= tokens + 2, (joined, counter.calls)
    assert counter.most_waiting_at_once == 1


async def test_a_reader_that_stops_reading_delays_nobody_and_catches_up_from_the_broker(
    broker: Broker,
) -> None:
    fanout = StreamFanout(broker, buffer_limit=READ_COUNT)
    total = READ_COUNT * 4
    async with fanout.subscribe(STREAM, None) as stalled, fanout.subscribe(STREAM, None) as reading:
        first = await broker.append_event(STREAM, events.token_event(" t-first"))
        assert [e.id for e in await stalled.read(timeout=5)] == [first]
        # The stalled reader reads no more while the whole answer is written and read by the other.
        _, seen = await asyncio.gather(write(broker, total, chunk=64, pause=0.0), read_to_end(reading))
        stored = await all_entries(broker)
        assert len(stored) == total + 2 and seen == stored
        assert stalled.detached >= 1  # cut off from the feed, which went on without it
        # When it reads again it gets the rest from the stored stream: nothing lost, nothing twice.
        rest = await read_to_end(stalled)
    assert rest == stored[1:]
    assert fanout.feeds() == 0


async def test_the_feed_stops_after_the_terminal_event_and_when_its_last_reader_leaves(
    broker: Broker,
) -> None:
    counter = ReadCounter(broker, STREAM)
    fanout = StreamFanout(broker)
    async with fanout.subscribe(STREAM, None) as subscription:
        assert await subscription.read(timeout=0.05) == []
        assert fanout.feeds() == 1
    assert fanout.feeds() == 0
    await asyncio.sleep(0.05)
    reads = counter.calls
    await broker.append_event(STREAM, events.token_event(" t"))
    await asyncio.sleep(0.1)
    assert counter.calls == reads  # nobody reads a stream nobody follows
    async with fanout.subscribe(STREAM, None) as subscription:
        await write(broker, 3)
        assert len(await read_to_end(subscription)) == 5
        await asyncio.sleep(0.05)
        assert fanout.feeds() == 0  # finished: the feed stopped with its reader still there


async def test_a_reader_that_joins_ahead_of_the_feed_gets_nothing_twice(broker: Broker) -> None:
    fanout = StreamFanout(broker)
    async with fanout.subscribe(STREAM, None) as first, fanout.subscribe(STREAM, None) as second:
        assert await first.read(timeout=0) == []  # the feed starts and waits for the first entry
        ids = [await broker.append_event(STREAM, events.token_event(f" t{i}")) for i in range(3)]
        # Before the feed has handed these on, the second reader reads them itself and joins.
        assert [e.id for e in await second.read(timeout=1)] == ids
        ids += await write(broker, 2)
        assert [e.id for e in await read_to_end(first)] == ids
        assert [e.id for e in await read_to_end(second)] == ids[3:]


async def test_a_resume_id_past_the_stream_does_not_blind_a_later_reader(broker: Broker) -> None:
    fanout = StreamFanout(broker)
    async with (
        fanout.subscribe(STREAM, "99999999999999-0") as ahead,
        fanout.subscribe(STREAM, None) as honest,
    ):
        assert await ahead.read(timeout=0.05) == []
        ids = await asyncio.gather(write(broker, 5), read_to_end(honest))
        assert [e.id for e in ids[1]] == ids[0]
        assert await ahead.read(timeout=0.05) == []  # nothing comes after its id


async def test_a_broker_error_reaches_each_reader_once_then_reading_resumes(broker: Broker) -> None:
    failures = 1

    async def failing_once(
        read: StreamsRead, after: Mapping[str, str | None], timeout: float, count: int
    ) -> dict[str, list[StreamEntry]]:
        """The read loop's read fails once, after the stream got entries."""
        nonlocal failures
        found = await read(after, timeout, count)
        if found.get(STREAM) and failures:
            failures -= 1
            raise BrokerError("redis went away")
        return found

    wrap_streams_reads(broker, failing_once)
    fanout = StreamFanout(broker)
    async with fanout.subscribe(STREAM, None) as one, fanout.subscribe(STREAM, None) as two:
        assert await one.read(timeout=0) == [] and await two.read(timeout=0) == []  # both join the feed
        ids = await write(broker, 4)
        for subscription in (one, two):
            errors, seen = 0, []
            while not (seen and events.is_terminal(seen[-1].data)):
                try:
                    seen.extend(await subscription.read(timeout=1.0))
                except BrokerError:
                    errors += 1
            assert errors == 1 and [e.id for e in seen] == ids


async def test_close_ends_every_feed(broker: Broker) -> None:
    fanout = StreamFanout(broker)
    async with fanout.subscribe(STREAM, None) as subscription:
        assert await subscription.read(timeout=0.05) == []
        await fanout.close()
        assert fanout.feeds() == 0
        try:
            await subscription.read(timeout=0.05)
        except BrokerError as exc:
            assert "shutting down" in str(exc)
        else:
            raise AssertionError("a closed fan-out still read")


async def test_readers_of_many_streams_share_one_broker_read_and_each_get_every_event_once(
    broker: Broker,
) -> None:
    """Eight answers written at once, each read by three readers (one resuming halfway, one joining
    late): one read loop follows all the streams, one broker read at a time for all of them, and every
    reader gets every event after its cursor exactly once, in order."""
    counter = ReadCounter(broker, "events:s0")
    fanout = StreamFanout(broker)
    names = [f"events:s{i}" for i in range(8)]
    results: dict[tuple[str, int], list[StreamEntry]] = {}
    cursors: dict[tuple[str, int], str | None] = {}

    async def write_stream(name: str, count: int) -> None:
        for i in range(count):
            await broker.append_events([(name, events.token_event(f" {name}-{i}"))])
            await asyncio.sleep(0.002)
        await broker.append_event(name, events.error_event("the end", None), terminal=True)

    async def reader(name: str, index: int, delay: float, halfway: bool) -> None:
        await asyncio.sleep(delay)
        after = None
        if halfway:
            stored = await broker.read_events(name, None, timeout=0, count=1000)
            after = stored[len(stored) // 2].id if stored else None
        cursors[name, index] = after
        async with fanout.subscribe(name, after) as subscription:
            results[name, index] = await read_to_end(subscription)

    await asyncio.gather(
        *(write_stream(name, 60 + 10 * i) for i, name in enumerate(names)),
        *(reader(name, 0, 0.0, False) for name in names),
        *(reader(name, 1, 0.05, True) for name in names),
        *(reader(name, 2, 0.1 + 0.01 * i, False) for i, name in enumerate(names)),
    )
    for (name, index), seen in results.items():
        stored = await broker.read_events(name, None, timeout=0, count=1000)
        after = cursors[name, index]
        expected = stored if after is None else [e for e in stored if stream_id_after(e.id, after)]
        assert seen == expected, (name, index)
    assert len(results) == 24
    assert counter.most_waiting_at_once == 1
    assert max(counter.streams_per_read) >= 4  # the streams were read together, not one loop each
    await asyncio.sleep(0.05)
    assert fanout.feeds() == 0
    await fanout.close()


async def test_a_stream_that_joins_while_the_loop_waits_is_read_at_once(broker: Broker) -> None:
    """The loop waits on one quiet stream; a second stream's reader joins and gets its events without
    waiting for the first stream's wait to end."""
    fanout = StreamFanout(broker)
    async with fanout.subscribe("events:quiet", None) as quiet:
        assert await quiet.read(timeout=0.05) == []  # the loop now waits on the quiet stream alone
        await asyncio.sleep(0.05)
        async with fanout.subscribe("events:busy", None) as busy:
            assert await busy.read(timeout=0) == []  # joins: the loop must wake to read it too
            started = asyncio.get_running_loop().time()
            await broker.append_event("events:busy", events.token_event(" hi"))
            entries = await busy.read(timeout=5.0)
            assert [e.data for e in entries] == [events.token_event(" hi")]
            assert asyncio.get_running_loop().time() - started < 1.0
    await fanout.close()
