"""The rebalancer's acceptance in virtual time, against each real broker: the fair queues, the worker
choice and the rebalancer (policy, snapshot from session records, round) are the server's own; the
workers are simulated (:class:`tests.support.scheduling_sim.FleetSimulation`): a told worker drains,
then loads for its load time. Two models, three switchable workers, as in issue 25's acceptance."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable

from oasst_inference_server.broker import Broker
from oasst_inference_server.scheduling.capacity import WorkerCapacity
from oasst_inference_server.scheduling.rebalancer import Rebalancer
from oasst_inference_server.settings import Settings
from tests.support.scheduling_sim import FleetDemand, FleetSimulation, FleetSwitcher, FleetWorker, SimJob

BrokerFactory = Callable[..., Awaitable[Broker]]
INTERVAL = 10.0
LOAD = {"A": 15.0, "B": 15.0}


def workers(placed: list[str | None]) -> list[FleetWorker]:
    return [
        FleetWorker(
            WorkerCapacity(f"w{i}", declared_slots=2), speed=20.0, model=model, load_seconds=dict(LOAD)
        )
        for i, model in enumerate(placed)
    ]


async def fleet(make_broker: BrokerFactory, placed: list[str | None], **settings):
    broker = await make_broker()
    config = Settings(_env_file=None, environment="development", **settings)  # type: ignore[call-arg]
    sim = FleetSimulation(broker, config, workers(placed))
    switcher = FleetSwitcher(sim)
    return sim, switcher, Rebalancer(broker, FleetDemand(sim), config, switcher, clock=lambda: sim.now)


async def rounds(
    sim: FleetSimulation, rebalancer: Rebalancer, until: float, seen: list[dict[str, int]]
) -> None:
    """Rebalancing rounds every INTERVAL up to ``until``; ``seen`` gets each round's workers per model."""
    while sim.now < until:
        await sim.run_until(sim.now + INTERVAL)
        await sim.publish_sessions()
        await rebalancer.tick()
        serving: dict[str, int] = {}
        for worker in sim.workers.values():
            if worker.model is not None and not worker.switching:
                serving[worker.model] = serving.get(worker.model, 0) + 1
        seen.append(serving)


def job(index: int, user: str = "u") -> SimJob:
    return SimJob(f"j{index}", f"{user}{index % 3}", 100, 300, 300)  # 20 s a slot at 20 tokens/s


async def test_a_burst_on_b_moves_workers_there_and_a_keeps_its_minimum(make_broker: BrokerFactory):
    sim, switcher, rebalancer = await fleet(make_broker, ["A", "A", "A"], rebalancer_min_workers={"A": 1})
    for i in range(40):  # B's burst at t=5; nobody serves B, and A is idle
        sim.arrive(5.0, job(i), "B")
    seen: list[dict[str, int]] = []
    await rounds(sim, rebalancer, 600.0, seen)
    # Two workers serve B from the third round on (two rounds of 10 s, a drain of nothing, a 15 s load).
    assert seen[2] == {"A": 1, "B": 2}, seen[:4]
    assert all(s.get("A", 0) >= 1 for s in seen)  # A's minimum held throughout
    assert sim.finished == 40 and all(not waiting for waiting in sim.waiting.values())
    assert [order[:2] for order in switcher.orders] == [("w0", "B"), ("w1", "B")]
    assert "B is starved: 40 queued" in rebalancer.decisions[0].reason


async def test_a_model_below_its_minimum_gets_it_back_when_nothing_asks(make_broker: BrokerFactory):
    # The burst is over: every worker serves B, A has none and a minimum of 1.
    sim, switcher, rebalancer = await fleet(make_broker, ["B", "B", "B"], rebalancer_min_workers={"A": 1})
    seen: list[dict[str, int]] = []
    await rounds(sim, rebalancer, 60.0, seen)
    assert seen[-1] == {"A": 1, "B": 2}
    assert [d.kind for d in rebalancer.decisions] == ["minimum"] and len(switcher.orders) == 1


async def test_steady_mixed_load_moves_a_few_workers_then_none(make_broker: BrokerFactory):
    # Placed 2 on A, 1 on B, while B asks for nearly twice A's traffic: 73 % of the fleet in all, so
    # queues come and go on whichever model has one worker (a flapping policy chases them).
    sim, switcher, rebalancer = await fleet(make_broker, ["A", "A", "B"], rebalancer_cooldown=60.0)
    rng = random.Random(7)
    index = 0
    for model, rate in (("A", 0.08), ("B", 0.14)):  # requests/s; a worker serves 0.1
        at = rng.expovariate(rate)
        while at < 1800:
            sim.arrive(at, job(index), model)
            index += 1
            at += rng.expovariate(rate)
    seen: list[dict[str, int]] = []
    await rounds(sim, rebalancer, 1800.0, seen)
    moves = [(d.from_model, d.to_model, d.at) for d in rebalancer.decisions]
    assert 1 <= len(moves) <= 2, [d.reason for d in rebalancer.decisions]
    assert len(switcher.orders) == len(moves)
    assert seen[-1] == {"A": 1, "B": 2}  # where the traffic is
    assert seen[60:] == [seen[-1]] * len(seen[60:])  # nothing moved in the last 20 minutes
    await sim.run_until(10**6)
    assert sim.finished == index
