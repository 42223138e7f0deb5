"""What only the Redis broker has: key prefixes, and failures surfacing as BrokerError."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from oasst_inference_server.broker import Broker, BrokerError, RedisBroker, WorkerSessionRecord
from oasst_inference_server.broker.keys import RedisKeys

pytestmark = pytest.mark.redis


Prefixes = Callable[[], str]


@pytest.fixture
async def two_brokers(
    redis_url: str, redis_prefix: Prefixes
) -> AsyncIterator[tuple[RedisBroker, RedisBroker]]:
    brokers = (
        RedisBroker(redis_url, key_prefix=redis_prefix()),
        RedisBroker(redis_url, key_prefix=redis_prefix()),
    )
    for broker in brokers:
        await broker.start()
    yield brokers
    for broker in brokers:
        await broker.close()


async def test_key_prefixes_isolate_brokers(two_brokers: tuple[RedisBroker, RedisBroker]) -> None:
    one, two = two_brokers
    await one.push_work("q", "m1")
    await one.append_event("s", "e1")
    await one.put_worker_session(WorkerSessionRecord("w", "m", "{}"), ttl=10)
    assert await one.acquire_lock("job", "a", 10)

    assert await two.queue_length("q") == 0
    assert await two.pop_work("q", 0.1) is None
    assert not await two.stream_exists("s")
    assert await two.read_events("s", None, timeout=0) == []
    assert await two.list_worker_sessions() == []
    assert await two.acquire_lock("job", "b", 10)

    async with two.subscribe_commands("w") as commands:
        await one.publish_command("w", "for one")
        await two.publish_command("w", "for two")
        assert await asyncio.wait_for(anext(commands), 5.0) == "for two"

    assert await one.queued_ids("q") == ["m1"]
    assert [e.data for e in await one.read_events("s", None, timeout=0)] == ["e1"]


async def test_every_key_is_under_the_prefix(
    two_brokers: tuple[RedisBroker, RedisBroker], redis_url: str
) -> None:
    broker, _ = two_brokers
    await broker.push_work("q", "m1")
    await broker.append_event("s", "e1", terminal=True)
    await broker.put_worker_session(WorkerSessionRecord("w", "m", "{}"), ttl=10)
    await broker.acquire_lock("job", "a", 10)
    client: Any = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        keys = {key async for key in client.scan_iter(match=RedisKeys(broker.keys.prefix).pattern)}
        ttl_ms = await client.pttl(broker.keys.stream("s"))
    finally:
        await client.aclose()
    prefix = broker.keys.prefix
    assert keys == {
        f"{prefix}queue:q:users",
        f"{prefix}queue:q:counters",
        f"{prefix}queue:q:u:",
        f"{prefix}queue:q:meta",
        f"{prefix}queue:q:len",
        f"{prefix}queue:q:wake",
        f"{prefix}stream:s",
        f"{prefix}session:w",
        f"{prefix}sessions",
        f"{prefix}lock:job",
    }
    assert 0 < ttl_ms <= 600_000  # the terminal event set the stream's expiry


async def test_a_waiting_popper_is_handed_its_hint_and_leaves_no_registration(
    two_brokers: tuple[RedisBroker, RedisBroker], redis_url: str
) -> None:
    """A push hands the next hint in fair order straight to a waiting popper; a popper whose wait ended
    is no longer registered, so a later push stays in the queue; a popper that gave up with a hint
    handed to it gives it back, with its user's counter as it was."""
    broker, _ = two_brokers
    base = broker.keys.queue("q")
    client: Any = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        waiting = asyncio.create_task(broker.pop_hint("q", 10.0))
        async with asyncio.timeout(5):
            while not await client.zcard(base + "idle"):
                await asyncio.sleep(0.01)
        await broker.push_work("q", "m1", user="u", cost=3, job="1 1 0")
        assert await asyncio.wait_for(waiting, 5.0) == ("m1", "1 1 0")
        assert await broker.pop_hint("q", 0.2) is None  # waited, then unregistered
        await broker.push_work("q", "m2", user="u", cost=2)
        assert await broker.queued_ids("q") == ["m2"]
        assert await client.zcard(base + "idle") == 0
        assert await broker.pop_work("q", 0) == "m2"
        before = await client.hget(base + "counters", "u")
        # A popper registered, was handed a hint, and gave up before taking it.
        assert await broker._fair_wait(keys=[base], args=["gone", 5000]) is None
        await broker.push_work("q", "m3", user="u", cost=4, job="2 2 0")
        assert await broker.queued_ids("q") == []
        await broker._give_back("q", base, "gone")
        assert await broker.queued_ids("q") == ["m3"]
        assert await client.hget(base + "counters", "u") == before
        assert await broker.pop_hint("q", 0) == ("m3", "2 2 0")
        assert not [key async for key in client.scan_iter(match=base + "hand:*")]
    finally:
        await client.aclose()


async def test_blocking_longer_than_the_socket_timeout(redis_url: str, redis_prefix: Prefixes) -> None:
    # Waits longer than the socket timeout are split into several blocking calls, not a timeout error.
    broker = RedisBroker(redis_url, key_prefix=redis_prefix(), socket_timeout=0.4)
    try:
        started = time.monotonic()
        assert await broker.pop_work("q", 1.0) is None
        assert await broker.read_events("s", None, timeout=1.0) == []
        assert time.monotonic() - started >= 1.8
    finally:
        await broker.close()


async def test_unreachable_redis_raises_broker_error() -> None:
    broker: Broker = RedisBroker("redis://127.0.0.1:1/0", key_prefix="unreachable:", retries=1)
    try:
        assert not await broker.ping()
        with pytest.raises(BrokerError):
            await broker.start()
        with pytest.raises(BrokerError):
            await broker.push_work("q", "m")
        with pytest.raises(BrokerError):
            await broker.pop_work("q", 0.2)
        with pytest.raises(BrokerError):
            await broker.append_event("s", "e", terminal=True)
        with pytest.raises(BrokerError):
            await broker.read_events("s", None, timeout=0.2)
        with pytest.raises(BrokerError):
            await broker.list_worker_sessions()
        with pytest.raises(BrokerError):
            await broker.acquire_lock("job", "a", 1)
        with pytest.raises(BrokerError):
            async with broker.subscribe_commands("w"):
                pass
    finally:
        await broker.close()


def test_repr_hides_the_password() -> None:
    broker = RedisBroker("redis://user:s3cret@127.0.0.1:6379/0")
    assert "s3cret" not in repr(broker)
    assert "127.0.0.1:6379" in repr(broker)


async def _kill_connections(redis_url: str, client_name: str) -> int:
    client: Any = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        killed = 0
        for info in await client.client_list():
            if info.get("name") == client_name:
                await client.client_kill_filter(_id=info["id"])
                killed += 1
        return killed
    finally:
        await client.aclose()


async def test_dropped_connections_are_recovered(redis_url: str, redis_prefix: Prefixes) -> None:
    # Only this broker's connections (a unique client name) are killed: others may share this Redis.
    name = f"test-{uuid.uuid4().hex}"
    broker = RedisBroker(redis_url, key_prefix=redis_prefix(), client_name=name)
    await broker.start()
    try:
        popper = asyncio.create_task(broker.pop_work("q", 10.0))
        reader = asyncio.create_task(broker.read_events("s", None, timeout=10.0))
        await asyncio.sleep(0.2)
        assert await _kill_connections(redis_url, name) >= 2
        await asyncio.sleep(0.2)
        await broker.push_work("q", "m1")
        entry_id = await broker.append_event("s", "e1")
        assert await asyncio.wait_for(popper, 5.0) == "m1"
        assert [e.id for e in await asyncio.wait_for(reader, 5.0)] == [entry_id]

        async with broker.subscribe_commands("w") as commands:
            assert await _kill_connections(redis_url, name) >= 1
            received = asyncio.ensure_future(anext(commands))
            # Commands published while the subscription reconnects are lost (at most once): repeat.
            deadline = time.monotonic() + 10.0
            while not received.done() and time.monotonic() < deadline:
                await broker.publish_command("w", "cancel")
                await asyncio.sleep(0.1)
            assert await asyncio.wait_for(received, 1.0) == "cancel"
    finally:
        await broker.close()


async def test_entries_are_read_from_redis_reply_whatever_their_fields(
    redis_url: str, redis_prefix: Prefixes
) -> None:
    """XREAD replies are parsed by the broker itself (not redis-py's callback): an entry whose
    ``data`` field is not the first, or that has none, reads as the others did."""
    prefix = redis_prefix()
    broker = RedisBroker(redis_url, key_prefix=prefix)
    await broker.start()
    raw = aioredis.from_url(redis_url, decode_responses=True)
    try:
        key = RedisKeys(prefix).stream("s")
        await broker.append_events([("s", "e1"), ("t", "x"), ("s", "e2 héllo 👋")])
        await raw.xadd(key, {"other": "o", "data": "e3"})
        await raw.xadd(key, {"other": "o"})
        entries = await broker.read_events("s", None, timeout=0)
        assert [e.data for e in entries] == ["e1", "e2 héllo 👋", "e3", ""]
        assert [e.id for e in entries] == [entry_id for entry_id, _ in await raw.xrange(key)]
        assert [e.data for e in await broker.read_events("t", None, timeout=1.0)] == ["x"]
    finally:
        await raw.aclose()
        await broker.close()
