"""Fair queues: hints of the backlogged user with the least counter go first (Virtual Token Counter).

Both brokers must pop the same order from the same pushes, and :meth:`queued_ids` (the order readers
are shown) must be the order hints really pop in.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable

from oasst_inference_server.broker import Broker

BrokerFactory = Callable[..., Awaitable[Broker]]


async def _drain(broker: Broker, queue: str = "q") -> list[str]:
    popped = []
    while (item := await broker.pop_work(queue, 0)) is not None:
        popped.append(item)
    return popped


async def test_two_users_alternate_however_many_each_sent(broker: Broker) -> None:
    for i in range(5):
        await broker.push_work("q", f"a{i}", user="A", cost=10)
    await broker.push_work("q", "b0", user="B", cost=10)
    await broker.push_work("q", "b1", user="B", cost=10)
    # B joins at A's counter (no credit): A (0) first by user id, then alternating while both wait.
    assert await _drain(broker) == ["a0", "b0", "a1", "b1", "a2", "a3", "a4"]


async def test_cost_decides_the_share(broker: Broker) -> None:
    for i in range(6):
        await broker.push_work("q", f"a{i}", user="A", cost=20)
        await broker.push_work("q", f"b{i}", user="B", cost=10)
    order = await _drain(broker)
    # B's jobs cost half as much: it gets two for each of A's.
    assert order[:6] == ["a0", "b0", "b1", "a1", "b2", "b3"]


async def test_returning_user_gets_no_credit_beyond_the_bound(make_broker: BrokerFactory) -> None:
    broker = await make_broker(fair_credit=25)
    await broker.push_work("q", "b-old", user="B", cost=10)
    assert await broker.pop_work("q", 0) == "b-old"  # B: 10, then idle
    for i in range(20):
        await broker.push_work("q", f"a{i}", user="A", cost=10)
    for _ in range(10):
        await broker.pop_work("q", 0)  # A served 100 tokens while B was away
    for i in range(10):
        await broker.push_work("q", f"b{i}", user="B", cost=10)
    order = await _drain(broker)
    # A's counter is 100: B is lifted to 75, so it may run ahead by 25 tokens (3 jobs), not by 90.
    assert order[:5] == ["b0", "b1", "b2", "a10", "b3"]


async def test_charge_corrects_the_estimate(broker: Broker) -> None:
    for i in range(3):
        await broker.push_work("q", f"a{i}", user="A", cost=10)
        await broker.push_work("q", f"b{i}", user="B", cost=10)
    assert await broker.pop_work("q", 0) == "a0"
    await broker.charge("q", "A", 50)  # a0 turned out 50 tokens longer than estimated
    assert await _drain(broker) == ["b0", "b1", "b2", "a1", "a2"]
    await broker.charge("q", "nobody", 5)  # unknown users are ignored


async def test_queued_ids_is_the_dispatch_order_at_every_step(broker: Broker) -> None:
    costs = {"A": 7.5, "B": 3.0, "C": 12.25}
    for i in range(8):
        for user, cost in costs.items():
            if i < {"A": 8, "B": 3, "C": 5}[user]:
                await broker.push_work("q", f"{user}{i}", user=user, cost=cost * (1 + i % 3))
    while True:
        predicted = await broker.queued_ids("q")
        assert len(predicted) == await broker.queue_length("q")
        popped = await broker.pop_work("q", 0)
        if popped is None:
            assert predicted == []
            break
        assert popped == predicted[0]
        assert await broker.queued_ids("q") == predicted[1:]


async def test_snapshot_shows_counters_and_backlog(broker: Broker) -> None:
    await broker.push_work("q", "a0", user="A", cost=4)
    await broker.push_work("q", "a1", user="A", cost=6)
    await broker.push_work("q", "b0", user="B", cost=1)
    assert await broker.pop_work("q", 0) == "a0"
    snapshot = await broker.queue_snapshot("q")
    assert snapshot.counters == {"A": 4.0, "B": 0.0}
    assert {user: [h.message_id for h in hints] for user, hints in snapshot.waiting.items()} == {
        "A": ["a1"],
        "B": ["b0"],
    }
    assert snapshot.floor == 0.0
    await broker.remove_work("q", "b0")
    await broker.remove_work("q", "a1")
    snapshot = await broker.queue_snapshot("q")
    assert snapshot.counters == {} and snapshot.waiting == {}
    assert await broker.queue_length("q") == 0


async def test_both_brokers_pop_the_same_order(make_broker: BrokerFactory) -> None:
    # A pseudo-random workload, pushes and pops interleaved: a fixed expectation both must meet.
    broker = await make_broker(fair_credit=15)
    seed = 12345
    popped: list[str] = []
    pushed = 0
    for step in range(300):
        seed = (seed * 1103515245 + 12345) % 2**31
        user = "ABCDE"[seed % 5]
        if seed % 3:
            await broker.push_work("q", f"m{step}", user=user, cost=(seed % 97) / 3)
            pushed += 1
        else:
            popped.append(str(await broker.pop_work("q", 0)))
        if step % 50 == 0:
            await broker.charge("q", user, -(seed % 11) / 7)
    popped += await _drain(broker)
    popped = [item for item in popped if item != "None"]
    assert sorted(popped) == sorted(set(popped)) and len(popped) == pushed
    digest = hashlib.sha256(",".join(popped).encode()).hexdigest()[:16]
    assert digest == EXPECTED_DIGEST, digest


EXPECTED_DIGEST = "6e2ed577ffc8b010"  # the same for both brokers


async def test_blocked_popper_gets_the_fair_choice(broker: Broker) -> None:
    popper = asyncio.create_task(broker.pop_work("q", 10.0))
    await asyncio.sleep(0.1)
    await broker.push_work("q", "x", user="A", cost=1)
    assert await asyncio.wait_for(popper, 5.0) == "x"
    assert await broker.queue_length("q") == 0


async def test_serve_now_counts_a_job_as_a_push_and_its_pop_would_and_never_jumps_a_queue(
    make_broker: BrokerFactory,
) -> None:
    broker = await make_broker(fair_credit=5)
    twin = await make_broker(fair_credit=5)
    # On an empty queue a job served at once leaves the counters as a push and a pop of it would.
    assert await broker.serve_now("q", user="A", cost=10) is True
    await twin.push_work("q", "a0", user="A", cost=10)
    assert await twin.pop_work("q", 0) == "a0"
    assert await broker.serve_now("q", user="B", cost=4) is True  # B joins at A's floor minus credit
    await twin.push_work("q", "b0", user="B", cost=4)
    assert await twin.pop_work("q", 0) == "b0"
    assert await broker.queue_length("q") == 0
    # While anything waits it refuses, and changes nothing.
    await broker.push_work("q", "a1", user="A", cost=10)
    await twin.push_work("q", "a1", user="A", cost=10)
    assert await broker.serve_now("q", user="C", cost=1) is False
    assert await broker.serve_now("q", user="A", cost=1) is False
    for each in (broker, twin):
        await each.push_work("q", "b1", user="B", cost=10)
        await each.push_work("q", "c0", user="C", cost=10)
    assert await broker.queue_snapshot("q") == await twin.queue_snapshot("q")
    assert await _drain(broker) == await _drain(twin)
