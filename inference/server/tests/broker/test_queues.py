"""Work queues: FIFO hints, blocking pops with a timeout, one item per popper."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from oasst_inference_server.broker import Broker

BrokerFactory = Callable[..., Awaitable[Broker]]


async def test_fifo_order(broker: Broker) -> None:
    for item in ("a", "b", "c"):
        await broker.push_work("q", item)
    assert [await broker.pop_work("q", 1.0) for _ in range(3)] == ["a", "b", "c"]
    assert await broker.pop_work("q", 0) is None


async def test_pop_timeout_returns_none(broker: Broker) -> None:
    started = time.monotonic()
    assert await broker.pop_work("empty", 0.3) is None
    elapsed = time.monotonic() - started
    assert 0.2 <= elapsed < 5.0


async def test_zero_and_tiny_timeouts_do_not_block(broker: Broker) -> None:
    # A block time of 0 means "forever" to BLPOP: neither may turn into an endless wait.
    started = time.monotonic()
    assert await broker.pop_work("empty", 0) is None
    assert await broker.pop_work("empty", 0.0001) is None
    assert await broker.pop_work("empty", -1) is None
    assert time.monotonic() - started < 5.0


async def test_blocked_pop_wakes_on_push(broker: Broker) -> None:
    popper = asyncio.create_task(broker.pop_work("q", 10.0))
    await asyncio.sleep(0.1)
    assert not popper.done()
    started = time.monotonic()
    await broker.push_work("q", "m1")
    assert await asyncio.wait_for(popper, 5.0) == "m1"
    assert time.monotonic() - started < 5.0


async def test_concurrent_poppers_each_get_a_distinct_item(broker: Broker) -> None:
    poppers = [asyncio.create_task(broker.pop_work("q", 10.0)) for _ in range(6)]
    await asyncio.sleep(0.1)
    items = [f"m{i}" for i in range(5)]
    for item in items:
        await broker.push_work("q", item)
    deadline = time.monotonic() + 5.0
    while sum(task.done() for task in poppers) < len(items) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.1)
    got = [task.result() for task in poppers if task.done()]
    pending = [task for task in poppers if not task.done()]
    assert sorted(got) == items  # every item taken exactly once
    assert len(pending) == 1  # the sixth popper is still waiting
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    assert await broker.queue_length("q") == 0


async def test_queues_are_independent(broker: Broker) -> None:
    await broker.push_work("q1", "a")
    assert await broker.pop_work("q2", 0.1) is None
    assert await broker.pop_work("q1", 0.1) == "a"


async def test_queue_length_queued_ids_and_remove(broker: Broker) -> None:
    assert await broker.queue_length("q") == 0
    assert await broker.queued_ids("q") == []
    for item in ("a", "b", "a", "c"):
        await broker.push_work("q", item)
    assert await broker.queue_length("q") == 4
    assert await broker.queued_ids("q") == ["a", "b", "a", "c"]
    await broker.remove_work("q", "a")
    assert await broker.queued_ids("q") == ["b", "c"]
    assert await broker.queue_length("q") == 2
    await broker.remove_work("q", "missing")
    await broker.remove_work("no-such-queue", "a")
    assert await broker.pop_work("q", 0) == "b"
    assert await broker.queued_ids("q") == ["c"]


async def test_cancelled_pop_does_not_swallow_a_later_item(broker: Broker) -> None:
    popper = asyncio.create_task(broker.pop_work("q", 10.0))
    await asyncio.sleep(0.1)
    popper.cancel()
    await asyncio.gather(popper, return_exceptions=True)
    # Redis notices the dropped connection of the cancelled BLPOP asynchronously.
    await asyncio.sleep(0.2)
    await broker.push_work("q", "m1")
    assert await broker.pop_work("q", 2.0) == "m1"


async def test_close_wakes_blocked_poppers(make_broker: BrokerFactory) -> None:
    broker = await make_broker()
    popper = asyncio.create_task(broker.pop_work("q", 30.0))
    await asyncio.sleep(0.1)
    await broker.close()
    assert await asyncio.wait_for(popper, 5.0) is None


async def test_a_hint_brings_back_its_job_note(broker: Broker) -> None:
    """pop_hint returns the note pushed with the hint, immediately and to a blocked popper alike; a
    hint pushed without one, or a second hint of a message whose note was taken, brings back ""."""
    await broker.push_work("q", "a", user="u", job="120 100 0")
    await broker.push_work("q", "b", user="u")
    popped = await broker.pop_hint("q", 1.0)
    assert popped is not None and (popped.message_id, popped.job) == ("a", "120 100 0")
    popped = await broker.pop_hint("q", 1.0)
    assert popped is not None and (popped.message_id, popped.job) == ("b", "")

    waiting = asyncio.create_task(broker.pop_hint("q", 10.0))
    await asyncio.sleep(0.1)
    await broker.push_work("q", "c", user="u", job="7 5 1")
    popped = await asyncio.wait_for(waiting, 5.0)
    assert popped is not None and (popped.message_id, popped.job) == ("c", "7 5 1")

    await broker.push_work("q", "d", user="u", job="1 1 0")
    await broker.push_work("q", "d", user="u")  # a duplicate hint (a re-queue raced the first)
    assert [await broker.pop_hint("q", 1.0) for _ in range(2)] == [("d", "1 1 0"), ("d", "")]


async def test_a_removed_hint_leaves_no_job_note(broker: Broker) -> None:
    await broker.push_work("q", "m", user="u", job="9 8 0")
    await broker.remove_work("q", "m")
    await broker.push_work("q", "m", user="u")
    popped = await broker.pop_hint("q", 1.0)
    assert popped is not None and (popped.message_id, popped.job) == ("m", "")
    assert await broker.pop_work("q", 0) is None
