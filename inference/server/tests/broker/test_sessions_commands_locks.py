"""Worker sessions with a TTL, command pub/sub, and locks with a TTL."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from oasst_inference_server.broker import Broker, WorkerSessionRecord

BrokerFactory = Callable[..., Awaitable[Broker]]


async def test_sessions_put_list_refresh_remove(broker: Broker) -> None:
    a = WorkerSessionRecord("s-a", "model-1", '{"free":1}')
    b = WorkerSessionRecord("s-b", "model-2", '{"free":2}')
    assert await broker.list_worker_sessions() == []
    await broker.put_worker_session(a, ttl=10)
    await broker.put_worker_session(b, ttl=10)
    assert sorted(await broker.list_worker_sessions()) == [a, b]
    a2 = a._replace(data='{"free":0}')
    await broker.put_worker_session(a2, ttl=10)
    assert sorted(await broker.list_worker_sessions()) == [a2, b]
    await broker.remove_worker_session("s-a")
    assert await broker.list_worker_sessions() == [b]
    await broker.remove_worker_session("s-a")
    await broker.remove_worker_session("unknown")


async def test_sessions_expire_unless_refreshed(broker: Broker) -> None:
    short = WorkerSessionRecord("short", "m", "{}")
    kept = WorkerSessionRecord("kept", "m", "{}")
    await broker.put_worker_session(short, ttl=0.3)
    await broker.put_worker_session(kept, ttl=0.6)
    await asyncio.sleep(0.35)
    await broker.put_worker_session(kept, ttl=0.6)  # a pong refreshes it
    deadline = time.monotonic() + 5.0
    while short in await broker.list_worker_sessions():
        assert time.monotonic() < deadline, "the session did not expire"
        await asyncio.sleep(0.05)
    assert kept in await broker.list_worker_sessions()
    deadline = time.monotonic() + 5.0
    while await broker.list_worker_sessions():
        assert time.monotonic() < deadline, "the session did not expire"
        await asyncio.sleep(0.05)


async def test_subscriber_receives_published_commands_in_order(broker: Broker) -> None:
    async with broker.subscribe_commands("w1") as commands:
        for i in range(5):
            await broker.publish_command("w1", f"cmd{i}")
        got = [await asyncio.wait_for(anext(commands), 5.0) for _ in range(5)]
    assert got == [f"cmd{i}" for i in range(5)]


async def test_two_subscribers_both_receive(broker: Broker) -> None:
    async with broker.subscribe_commands("w1") as one, broker.subscribe_commands("w1") as two:
        await broker.publish_command("w1", '{"type":"cancel"}')
        assert await asyncio.wait_for(anext(one), 5.0) == '{"type":"cancel"}'
        assert await asyncio.wait_for(anext(two), 5.0) == '{"type":"cancel"}'


async def test_other_channels_are_not_received(broker: Broker) -> None:
    async with broker.subscribe_commands("w1") as commands:
        await broker.publish_command("w2", "not for w1")
        await broker.publish_command("w1", "for w1")
        assert await asyncio.wait_for(anext(commands), 5.0) == "for w1"
        pending = asyncio.create_task(anext(commands))
        await asyncio.sleep(0.2)
        assert not pending.done()
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)


async def test_publish_without_subscribers_and_after_unsubscribe(broker: Broker) -> None:
    await broker.publish_command("nobody", "x")
    async with broker.subscribe_commands("w1"):
        pass
    await broker.publish_command("w1", "x")
    async with broker.subscribe_commands("w1") as commands:
        await broker.publish_command("w1", "y")
        # Commands are not stored: the one published while nobody listened is gone.
        assert await asyncio.wait_for(anext(commands), 5.0) == "y"


async def test_close_ends_subscriptions(make_broker: BrokerFactory) -> None:
    broker = await make_broker()
    received: list[str] = []

    async def listen() -> None:
        async with broker.subscribe_commands("w1") as commands:
            async for data in commands:
                received.append(data)

    listener = asyncio.create_task(listen())
    await asyncio.sleep(0.2)
    await broker.publish_command("w1", "x")
    await asyncio.sleep(0.2)
    await broker.close()
    await asyncio.wait_for(listener, 5.0)
    assert received == ["x"]


async def test_lock_is_exclusive_between_owners(broker: Broker) -> None:
    assert await broker.acquire_lock("job", "a", 5)
    assert not await broker.acquire_lock("job", "b", 5)
    assert await broker.acquire_lock("other-job", "b", 5)


async def test_lock_reacquire_by_owner_extends(broker: Broker) -> None:
    assert await broker.acquire_lock("job", "a", 0.6)
    await asyncio.sleep(0.4)
    assert await broker.acquire_lock("job", "a", 0.6)
    await asyncio.sleep(0.4)  # past the first ttl, within the extension
    assert not await broker.acquire_lock("job", "b", 5)


async def test_lock_expires_after_ttl(broker: Broker) -> None:
    assert await broker.acquire_lock("job", "a", 0.2)
    await asyncio.sleep(0.4)
    assert await broker.acquire_lock("job", "b", 5)
    assert not await broker.acquire_lock("job", "a", 5)


async def test_lock_release_only_by_owner(broker: Broker) -> None:
    await broker.release_lock("job", "nobody")  # not held: no error
    assert await broker.acquire_lock("job", "a", 5)
    await broker.release_lock("job", "b")
    assert not await broker.acquire_lock("job", "b", 5)
    await broker.release_lock("job", "a")
    assert await broker.acquire_lock("job", "b", 5)


async def test_ping(broker: Broker) -> None:
    assert await broker.ping()


async def test_slots_cap_holders_and_expire(broker: Broker) -> None:
    assert await broker.acquire_slot("readers", "a", 2, ttl=0.3)
    assert await broker.acquire_slot("readers", "b", 2, ttl=10)
    assert not await broker.acquire_slot("readers", "c", 2, ttl=10)  # full
    assert await broker.acquire_slot("readers", "a", 2, ttl=0.3)  # a holder extends its own
    assert await broker.acquire_slot("other", "c", 2, ttl=10)  # names are independent
    await broker.release_slot("readers", "b")
    await broker.release_slot("readers", "nobody")
    assert await broker.acquire_slot("readers", "c", 2, ttl=10)
    assert not await broker.acquire_slot("readers", "d", 2, ttl=10)
    deadline = time.monotonic() + 5.0
    while not await broker.acquire_slot("readers", "d", 2, ttl=10):  # a's slot expires
        assert time.monotonic() < deadline, "the slot did not expire"
        await asyncio.sleep(0.05)


async def test_several_slots_are_taken_all_or_none_at_once(broker: Broker) -> None:
    both = [("sse-user:u", 2), ("sse-message:m", 1)]
    assert await broker.acquire_slots(both, "a", ttl=10) is None
    assert await broker.acquire_slots(both, "a", ttl=10) is None  # a holder extends its own
    # The message's only slot is a's: b gets neither, and the user's second slot stays free.
    assert await broker.acquire_slots(both, "b", ttl=10) == "sse-message:m"
    assert await broker.acquire_slot("sse-user:u", "c", 2, ttl=10)
    assert await broker.acquire_slots(both, "d", ttl=10) == "sse-user:u"  # full now too
    await broker.release_slots(["sse-user:u", "sse-message:m"], "a")
    await broker.release_slots(["sse-user:u", "sse-message:m"], "nobody")
    assert await broker.acquire_slots(both, "b", ttl=10) is None
