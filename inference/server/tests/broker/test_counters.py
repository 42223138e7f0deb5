"""The broker's usage counters (both brokers): windows and plain counters checked and added in one step,
charges at most once per name, and two replicas on one Redis that never let a burst past a limit."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from oasst_inference_server.broker import Broker, RedisBroker
from oasst_inference_server.broker.counters import CounterAdd, CounterCheck, MemoryCounters


async def test_a_window_admits_up_to_its_limit_then_says_when(broker: Broker) -> None:
    check = CounterCheck("rpm:a", limit=3, need=1, window=60)
    for _ in range(3):
        assert await broker.check_counters([check]) is None
    refused = await broker.check_counters([check])
    assert refused is not None
    assert (refused.position, refused.used) == (0, 3)
    assert refused.retry_after is not None and 1 <= refused.retry_after <= 60
    assert await broker.read_counters([("rpm:a", 60)]) == [3]


async def test_all_or_nothing_the_first_full_counter_is_named(broker: Broker) -> None:
    await broker.add_counters([CounterAdd("tpm:user", 100, window=60)])
    checks = [
        CounterCheck("rpm:key", limit=10, need=2, window=60),
        CounterCheck("tpm:user", limit=100, need=0, window=60),
    ]
    refused = await broker.check_counters(checks)
    assert refused is not None and refused.position == 1 and refused.used == 100
    # Nothing was added to the counter that had room.
    assert await broker.read_counters([("rpm:key", 60), ("tpm:user", 60)]) == [0, 100]


async def test_a_plain_counter_refuses_once_it_reaches_the_limit(broker: Broker) -> None:
    budget = CounterCheck("budget:day", limit=50, need=0, ttl=3600)
    assert await broker.check_counters([budget]) is None
    await broker.add_counters([CounterAdd("budget:day", 49, ttl=3600)])
    assert await broker.check_counters([budget]) is None  # 49 < 50: one more request may start
    await broker.add_counters([CounterAdd("budget:day", 1, ttl=3600)])
    refused = await broker.check_counters([budget])
    assert refused is not None and refused.used == 50 and refused.retry_after is None


async def test_a_need_over_the_limit_has_no_retry_time(broker: Broker) -> None:
    refused = await broker.check_counters([CounterCheck("rpm:n", limit=2, need=3, window=60)])
    assert refused is not None and refused.retry_after is None and refused.used == 0


async def test_adds_under_one_once_name_count_once(broker: Broker) -> None:
    adds = [CounterAdd("tokens", 7, window=60), CounterAdd("total", 7, ttl=600)]
    assert await broker.add_counters(adds, once="message-1", once_ttl=600)
    assert not await broker.add_counters(adds, once="message-1", once_ttl=600)
    assert await broker.add_counters(adds, once="message-2", once_ttl=600)
    assert await broker.read_counters([("tokens", 60), ("total", 0), ("missing", 0)]) == [14, 14, 0]


async def test_seeding_sets_only_a_missing_counter(broker: Broker) -> None:
    assert await broker.seed_counter("seeded", 40, ttl=600)
    assert not await broker.seed_counter("seeded", 5, ttl=600)
    assert await broker.read_counters([("seeded", 0)]) == [40]


def test_window_buckets_leave_the_window_and_free_room() -> None:
    now = [1000.0]
    counters = MemoryCounters(clock=lambda: now[0])
    check = CounterCheck("w", limit=2, need=1, window=60)
    assert counters.check([check]) is None
    now[0] = 1030.0
    assert counters.check([check]) is None
    refused = counters.check([check])
    assert refused is not None and refused.retry_after == 30  # the bucket of second 1000 leaves at 1060
    now[0] = 1060.0
    assert counters.check([check]) is None
    assert counters.read([("w", 60)]) == [2]


@pytest.mark.redis
async def test_a_burst_split_between_two_replicas_cannot_pass_the_limit(
    replicas: tuple[RedisBroker, RedisBroker],
) -> None:
    checks = [CounterCheck("rpm:key:k", limit=5, need=1, window=60), CounterCheck("rpm:user:u", 8, 1, 60)]
    results = await asyncio.gather(*(replicas[i % 2].check_counters(checks) for i in range(40)))
    assert sum(r is None for r in results) == 5
    assert await replicas[1].read_counters([("rpm:key:k", 60), ("rpm:user:u", 60)]) == [5, 5]


async def test_a_seeded_counter_is_missing_until_rebuilt_and_charges_wait_for_it(broker: Broker) -> None:
    budget = CounterCheck("budget:month", limit=100, need=0, ttl=3600, seeded=True)
    refused = await broker.check_counters([CounterCheck("rpm:x", 5, 1, 60), budget])
    assert refused is not None and refused.missing and refused.position == 1
    assert await broker.read_counters([("rpm:x", 60)]) == [0]  # nothing added on the way
    # A charge does not create it: the database (which has that usage) rebuilds it whole.
    await broker.add_counters([CounterAdd("budget:month", 30, ttl=3600, existing_only=True)])
    assert (await broker.check_counters([budget])).missing  # type: ignore[union-attr]
    assert await broker.seed_counter("budget:month", 90, ttl=3600)
    assert await broker.check_counters([budget]) is None
    await broker.add_counters([CounterAdd("budget:month", 10, ttl=3600, existing_only=True)])
    refused = await broker.check_counters([budget])
    assert refused is not None and not refused.missing and refused.used == 100


async def test_a_zero_add_creates_no_counter(broker: Broker) -> None:
    """Both brokers alike: nothing to add changes nothing, so a counter rebuilt from the database when
    missing is not made to exist, at 0, by a charge of nothing."""
    await broker.add_counters([CounterAdd("budget:zero", 0, ttl=600), CounterAdd("tpm:zero", 0, window=60)])
    await broker.check_counters([CounterCheck("rpm:zero", limit=5, need=0, window=60)])
    refused = await broker.check_counters([CounterCheck("budget:zero", limit=10, ttl=600, seeded=True)])
    assert refused is not None and refused.missing


def test_memory_counters_forget_what_expired() -> None:
    """Markers, budgets and windows of generations long done do not pile up in the in-process broker."""
    now = [1000.0]
    counters = MemoryCounters(clock=lambda: now[0])
    per_round = 2000
    for round_ in range(10):
        for i in range(per_round):
            name = f"{round_}:{i}"
            adds = [CounterAdd(f"tpm:{name}", 1, window=60), CounterAdd(f"budget:{name}", 1, ttl=60)]
            assert counters.add(adds, once=f"charged:{name}", once_ttl=60)
        now[0] += 120  # all of this round expired
    assert counters.entries() <= 4 * 3 * per_round  # ten rounds of 3 * per_round without the sweep
    assert counters.add([CounterAdd("budget:9:0", 1, ttl=60)], once="charged:9:0", once_ttl=60)
    assert counters.read([("budget:9:0", 0), ("tpm:9:1", 60)]) == [1, 0]


@pytest.mark.redis
async def test_a_window_only_ever_added_to_keeps_only_the_buckets_in_it(
    replicas: tuple[RedisBroker, RedisBroker], redis_url: str
) -> None:
    broker = replicas[0]
    key = broker.keys.counter("tpm:charged-only")
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.hset(key, mapping={"100": 5, "200": 7})  # buckets of seconds long gone
        await broker.add_counters([CounterAdd("tpm:charged-only", 3, window=60)])
        assert await client.hlen(key) == 1
    finally:
        await client.aclose()
    assert await broker.read_counters([("tpm:charged-only", 60)]) == [3]
