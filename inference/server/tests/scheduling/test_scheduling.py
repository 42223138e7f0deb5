"""Scheduling acceptance, as deterministic simulations in virtual time against each real
broker: the fair queue, the tickets, the corrections and the worker choice are the server's own
(:mod:`tests.support.scheduling_sim`); only the workers are simulated, at fixed speeds."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from oasst_inference_server.broker import Broker
from oasst_inference_server.scheduling.capacity import WorkerCapacity
from oasst_inference_server.settings import Settings
from tests.support.scheduling_sim import SimJob, Simulation, SimWorker, pseudo_random

BrokerFactory = Callable[..., Awaitable[Broker]]
SETTINGS = Settings()


def _jobs(user: str, count: int, seed: int, weight: float = 1.0) -> list[SimJob]:
    draw = pseudo_random(seed)
    return [SimJob(f"{user}{i}", user, draw(20, 40), 100, draw(70, 100), weight=weight) for i in range(count)]


def _served_while_both_wait(sim: Simulation, arrival_index: int, late_user: str) -> dict[str, int]:
    """Tokens dispatched to each user from the late user's arrival to its last dispatch."""
    last = max(d.index for d in sim.dispatches if d.job.user == late_user)
    served: dict[str, int] = {}
    for d in sim.dispatches[arrival_index : last + 1]:
        served[d.job.user] = served.get(d.job.user, 0) + d.job.tokens
    return served


async def _heavy_then_light(
    make_broker: BrokerFactory, *, weight_a: float, weight_b: float, b_jobs: int
) -> tuple[Simulation, int]:
    broker = await make_broker(fair_credit=0)
    slots = 4
    sim = Simulation(broker, SETTINGS, [SimWorker(WorkerCapacity("w", declared_slots=slots), speed=50.0)])
    for job in _jobs("A", 200, seed=1, weight=weight_a):
        await sim.submit(job)
    await sim.run(until_dispatches=20)  # A alone for a while: its counter is well ahead of zero
    arrival = len(sim.dispatches)
    for job in _jobs("B", b_jobs, seed=2, weight=weight_b):
        await sim.submit(job)
    await sim.run()
    assert len(sim.finished_at) == 200 + b_jobs
    return sim, arrival


async def test_a_light_user_is_served_alongside_a_heavy_one(make_broker: BrokerFactory) -> None:
    sim, arrival = await _heavy_then_light(make_broker, weight_a=1.0, weight_b=1.0, b_jobs=10)
    first_b = min(d.index for d in sim.dispatches if d.job.user == "B")
    assert first_b - arrival < 4  # within (worker slots) dispatches of B's arrival
    served = _served_while_both_wait(sim, arrival, "B")
    assert abs(served["A"] - served["B"]) < 0.1 * max(served.values()), served


async def test_weights_two_to_one_split_the_tokens_two_to_one(make_broker: BrokerFactory) -> None:
    sim, arrival = await _heavy_then_light(make_broker, weight_a=2.0, weight_b=1.0, b_jobs=40)
    served = _served_while_both_wait(sim, arrival, "B")
    assert abs(served["A"] / served["B"] - 2.0) < 0.2, served  # 2:1 within 10 %


async def test_workers_get_work_by_capacity_and_speed(make_broker: BrokerFactory) -> None:
    broker = await make_broker()
    workers = [
        SimWorker(WorkerCapacity("slow-1", declared_slots=1), speed=10.0),
        SimWorker(WorkerCapacity("slow-2", declared_slots=2), speed=10.0),
        SimWorker(WorkerCapacity("fast-4", declared_slots=4), speed=30.0),
    ]
    sim = Simulation(broker, SETTINGS, workers)

    def never_over_capacity(job: SimJob, worker: SimWorker) -> None:
        for w in workers:
            assert 0 <= w.capacity.in_flight <= w.capacity.declared_slots
        assert worker.capacity.in_flight < worker.capacity.declared_slots

    sim.on_dispatch = never_over_capacity
    draw = pseudo_random(7)
    jobs = [SimJob(f"j{i}", f"user{i % 5}", draw(10, 30), 100, draw(50, 100)) for i in range(300)]
    for job in jobs:
        await sim.submit(job)
    await sim.run()
    assert len(sim.finished_at) == 300
    fast, slow_1, slow_2 = workers[2], workers[0], workers[1]
    assert fast.tokens_done >= 2 * max(slow_1.tokens_done, slow_2.tokens_done)
    # The ideal: all work spread over the total throughput (a lower bound no schedule beats).
    throughput = sum(w.capacity.declared_slots * w.speed for w in workers)
    ideal = sum(job.tokens for job in jobs) / throughput
    makespan = max(sim.finished_at.values())
    assert makespan <= 1.2 * ideal, (makespan, ideal)
