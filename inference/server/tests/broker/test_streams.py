"""Event streams: increasing ids, independent readers, resume without duplicates or gaps, expiry."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from oasst_inference_server.broker import Broker, StreamEntry, parse_stream_id

BrokerFactory = Callable[..., Awaitable[Broker]]


async def append_all(broker: Broker, stream: str, datas: list[str], terminal_last: bool = False) -> list[str]:
    ids = []
    for i, data in enumerate(datas):
        terminal = terminal_last and i == len(datas) - 1
        ids.append(await broker.append_event(stream, data, terminal=terminal))
    return ids


async def read_until(broker: Broker, stream: str, stop: str, after: str | None = None) -> list[StreamEntry]:
    """Read like an SSE relay does, until the event with data ``stop``."""
    seen: list[StreamEntry] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        batch = await broker.read_events(stream, after, timeout=1.0, count=4)
        seen.extend(batch)
        if batch:
            after = batch[-1].id
            if batch[-1].data == stop:
                return seen
    raise AssertionError(f"never saw {stop!r}; got {seen}")


async def test_ids_strictly_increase(broker: Broker) -> None:
    ids = await append_all(broker, "s", [f"e{i}" for i in range(200)])
    parsed = [parse_stream_id(i) for i in ids]
    assert all(a < b for a, b in zip(parsed, parsed[1:], strict=False))
    entries = await broker.read_events("s", None, timeout=0, count=1000)
    assert [e.id for e in entries] == ids


async def test_read_from_none_returns_everything_in_order(broker: Broker) -> None:
    datas = ['{"event_type":"token","text":"h\\u00e9"}', '{"t":"héllo 👋"}', "3"]
    ids = await append_all(broker, "s", datas)
    expected = [StreamEntry(i, d) for i, d in zip(ids, datas, strict=True)]
    assert await broker.read_events("s", None, timeout=1.0) == expected


async def test_read_after_an_id_returns_only_later_ones(broker: Broker) -> None:
    ids = await append_all(broker, "s", ["a", "b", "c", "d"])
    assert [e.data for e in await broker.read_events("s", ids[1], timeout=1.0)] == ["c", "d"]
    assert await broker.read_events("s", ids[-1], timeout=0) == []


async def test_count_limits_one_read(broker: Broker) -> None:
    await append_all(broker, "s", [str(i) for i in range(10)])
    assert [e.data for e in await broker.read_events("s", None, timeout=0, count=4)] == ["0", "1", "2", "3"]


async def test_read_of_missing_stream_times_out_empty(broker: Broker) -> None:
    started = time.monotonic()
    assert await broker.read_events("nothing", None, timeout=0.3) == []
    assert 0.2 <= time.monotonic() - started < 5.0
    assert await broker.read_events("nothing", None, timeout=0) == []
    assert await broker.read_events("nothing", None, timeout=0.0001) == []


async def test_a_batch_append_keeps_order_across_streams(broker: Broker) -> None:
    before = await broker.append_event("a", "a0")
    batch = [("a", "a1"), ("b", "b1"), ("a", "a2"), ("b", "b2 héllo 👋"), ("a", "a3")]
    await broker.append_events(batch)
    await broker.append_events([])
    after = await broker.append_event("a", "a4", terminal=True)
    a = await broker.read_events("a", None, timeout=1.0)
    assert [e.data for e in a] == ["a0", "a1", "a2", "a3", "a4"]
    assert a[0].id == before and a[-1].id == after
    parsed = [parse_stream_id(e.id) for e in a]
    assert all(x < y for x, y in zip(parsed, parsed[1:], strict=False))
    assert [e.data for e in await broker.read_events("b", None, timeout=1.0)] == ["b1", "b2 héllo 👋"]


async def test_a_batch_append_wakes_a_blocked_reader(broker: Broker) -> None:
    reader = asyncio.create_task(broker.read_events("s", None, timeout=10.0))
    await asyncio.sleep(0.1)
    assert not reader.done()
    await broker.append_events([("s", "x"), ("s", "y")])
    woken = await asyncio.wait_for(reader, 5.0)
    assert [e.data for e in woken][:1] == ["x"]


async def test_blocked_reader_wakes_on_append(broker: Broker) -> None:
    first = await broker.append_event("s", "a")
    reader = asyncio.create_task(broker.read_events("s", first, timeout=10.0))
    await asyncio.sleep(0.1)
    assert not reader.done()
    second = await broker.append_event("s", "b")
    assert await asyncio.wait_for(reader, 5.0) == [StreamEntry(second, "b")]


async def test_reader_waiting_for_a_new_stream_wakes_on_first_event(broker: Broker) -> None:
    reader = asyncio.create_task(broker.read_events("fresh", None, timeout=10.0))
    await asyncio.sleep(0.1)
    entry_id = await broker.append_event("fresh", "first")
    assert await asyncio.wait_for(reader, 5.0) == [StreamEntry(entry_id, "first")]


async def test_several_readers_each_see_every_event(broker: Broker) -> None:
    datas = [f"t{i}" for i in range(30)] + ["done"]
    readers = [asyncio.create_task(read_until(broker, "s", "done")) for _ in range(3)]
    await asyncio.sleep(0.05)
    ids = []
    for i, data in enumerate(datas):
        ids.append(await broker.append_event("s", data, terminal=data == "done"))
        if i % 7 == 0:
            await asyncio.sleep(0.01)
    late_reader = await read_until(broker, "s", "done")
    for seen in [*await asyncio.gather(*readers), late_reader]:
        assert [e.id for e in seen] == ids
        assert [e.data for e in seen] == datas


async def test_resume_from_the_middle_has_no_duplicate_and_no_gap(broker: Broker) -> None:
    ids = await append_all(broker, "s", [str(i) for i in range(20)] + ["done"], terminal_last=True)
    first_part = await broker.read_events("s", None, timeout=0, count=7)
    assert len(first_part) == 7
    # The client drops and reconnects with Last-Event-ID = the last id it saw.
    rest = await read_until(broker, "s", "done", after=first_part[-1].id)
    assert [e.id for e in first_part + rest] == ids


async def test_resume_while_the_stream_is_still_growing(broker: Broker) -> None:
    async def produce() -> list[str]:
        ids = []
        for i in range(40):
            ids.append(await broker.append_event("s", str(i)))
            await asyncio.sleep(0.002)
        ids.append(await broker.append_event("s", "done", terminal=True))
        return ids

    producer = asyncio.create_task(produce())
    seen: list[StreamEntry] = []
    after = None
    while not seen or seen[-1].data != "done":
        # A fresh "connection" for every small batch.
        batch = await broker.read_events("s", after, timeout=5.0, count=3)
        assert batch, "no event within the timeout"
        seen.extend(batch)
        after = batch[-1].id
    assert [e.id for e in seen] == await producer


async def test_short_form_id_is_accepted(broker: Broker) -> None:
    ids = await append_all(broker, "s", ["a", "b"])
    ms = parse_stream_id(ids[0]).ms
    entries = await broker.read_events("s", str(ms - 1), timeout=0)
    assert [e.data for e in entries] == ["a", "b"]


@pytest.mark.parametrize(
    "bad", ["", "$", ">", "+", "-", "abc", "1-2-3", "1-", "-1", "1.5", "99999999999999999999999"]
)
async def test_malformed_after_id_is_a_value_error(broker: Broker, bad: str) -> None:
    await broker.append_event("s", "a")
    with pytest.raises(ValueError):
        await broker.read_events("s", bad, timeout=0)


async def test_maxlen_cap(make_broker: BrokerFactory, broker_kind: str) -> None:
    broker = await make_broker(stream_maxlen=10)
    ids = await append_all(broker, "s", [str(i) for i in range(300)])
    entries = await broker.read_events("s", None, timeout=0, count=1000)
    # Redis trims approximately (whole radix-tree nodes): at least the newest maxlen entries remain.
    assert 10 <= len(entries) < 300
    assert [e.id for e in entries] == ids[-len(entries) :]
    if broker_kind == "memory":
        assert len(entries) == 10


async def test_terminal_event_expires_the_stream(make_broker: BrokerFactory) -> None:
    broker = await make_broker(stream_ttl=0.5)
    await broker.append_event("s", "a")
    await broker.append_event("s", "done", terminal=True)
    assert await broker.stream_exists("s")
    assert len(await broker.read_events("s", None, timeout=0)) == 2
    deadline = time.monotonic() + 5.0
    while await broker.stream_exists("s"):
        assert time.monotonic() < deadline, "the stream did not expire"
        await asyncio.sleep(0.05)
    assert await broker.read_events("s", None, timeout=0) == []


async def test_an_unfinished_stream_outlives_the_terminal_ttl_but_expires_when_idle(
    make_broker: BrokerFactory,
) -> None:
    broker = await make_broker(stream_ttl=0.2, stream_idle_ttl=1.5)
    await broker.append_event("s", "a")
    await asyncio.sleep(0.5)
    await broker.append_events([("s", "b")])  # every event pushes the idle expiry back
    await asyncio.sleep(0.6)
    assert await broker.stream_exists("s")
    # No terminal event ever comes (the chat was deleted mid-answer): it expires all the same.
    deadline = time.monotonic() + 5.0
    while await broker.stream_exists("s"):
        assert time.monotonic() < deadline, "the idle stream did not expire"
        await asyncio.sleep(0.05)


async def test_a_trimmed_stream_names_its_oldest_kept_entry(make_broker: BrokerFactory) -> None:
    broker = await make_broker(stream_maxlen=10)
    assert await broker.first_kept_if_trimmed("s") is None
    await append_all(broker, "s", [str(i) for i in range(5)])
    assert await broker.first_kept_if_trimmed("s") is None
    await append_all(broker, "s", [str(i) for i in range(300)])
    kept = await broker.read_events("s", None, timeout=0, count=1000)
    assert await broker.first_kept_if_trimmed("s") == kept[0].id


async def test_delete_stream(broker: Broker) -> None:
    assert not await broker.stream_exists("s")
    old = await broker.append_event("s", "a")
    assert await broker.stream_exists("s")
    await broker.delete_stream("s")
    assert not await broker.stream_exists("s")
    assert await broker.read_events("s", None, timeout=0) == []
    await broker.delete_stream("s")
    await broker.delete_stream("never-existed")
    # A retried message starts a new stream; a reader resuming from an old id must still see it,
    # even when the new stream starts within the same millisecond.
    for _ in range(20):
        new = await broker.append_event("s", "b")
        assert parse_stream_id(new) > parse_stream_id(old)
        assert [e.data for e in await broker.read_events("s", old, timeout=0)] == ["b"]
        old = await broker.append_event("s", "c")
        await broker.delete_stream("s")


async def test_close_wakes_blocked_readers(make_broker: BrokerFactory) -> None:
    broker = await make_broker()
    last = await broker.append_event("s", "a")
    readers = [
        asyncio.create_task(broker.read_events("s", last, timeout=30.0)),
        asyncio.create_task(broker.read_events("other", None, timeout=30.0)),
    ]
    await asyncio.sleep(0.1)
    await broker.close()
    assert await asyncio.wait_for(asyncio.gather(*readers), 5.0) == [[], []]


async def test_one_streams_read_returns_each_streams_entries_after_its_own_id(broker: Broker) -> None:
    a0 = await broker.append_event("a", "a0")
    await broker.append_events([("a", "a1"), ("b", "b0"), ("a", "a2")])
    reader = broker.streams_reader()
    try:
        found = await reader.read({"a": a0, "b": None, "c": None}, timeout=1.0, count=1)
        assert {s: [e.data for e in entries] for s, entries in found.items()} == {"a": ["a1"], "b": ["b0"]}
        a1, b0 = found["a"][0].id, found["b"][0].id
        found = await reader.read({"a": a1, "b": b0}, timeout=0)
        assert {s: [e.data for e in entries] for s, entries in found.items()} == {"a": ["a2"]}
        # Nothing after these ids: it waits for the first append to any of the streams.
        waiting = asyncio.create_task(reader.read({"b": b0, "c": None}, 10.0))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        await broker.append_event("c", "c0")
        found = await asyncio.wait_for(waiting, 5.0)
        assert {s: [e.data for e in entries] for s, entries in found.items()} == {"c": ["c0"]}
    finally:
        await reader.close()


async def test_wake_ends_a_streams_read_that_waits(broker: Broker) -> None:
    reader = broker.streams_reader()
    try:
        waiting = asyncio.create_task(reader.read({"quiet": None}, timeout=30.0))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        reader.wake()
        assert await asyncio.wait_for(waiting, 5.0) == {}
        reader.wake()  # with no read under way: the next one does not wait
        assert await asyncio.wait_for(reader.read({"quiet": None}, timeout=30.0), 5.0) == {}
        await broker.append_event("quiet", "x")  # and the one after reads as usual
        assert [e.data for e in (await reader.read({"quiet": None}, timeout=5.0))["quiet"]] == ["x"]
    finally:
        await reader.close()
