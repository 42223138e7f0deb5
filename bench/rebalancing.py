"""Benchmark 12: the rebalancer. 1,000 simulated workers, 5 models, demand that moves between them.

A simulation in virtual time with the server's own scheduling code: each model's fair queue in the
in-process broker, the worker choice (``choose_worker``), and the rebalancer unchanged (its policy, its
snapshot built from worker session records in the broker, its loop's round) with the simulation as its
switcher (a told worker drains, then loads for its load time) and as its database (waiting requests,
arrivals and service times). Only the workers are simulated: each request holds a slot for its tokens
at a fixed speed. The same arrivals (Poisson, one seeded stream) run on a fleet placed evenly and left
so, and on the same fleet with the rebalancer's rounds every ``rebalance_interval`` seconds: with the
settings' defaults (a round moves at most 5 % of the workers: 50 of 1,000), and with the share off (10
moves a round, ``rebalancer_max_moves``): a round's moves bound how fast 1,000 workers follow demand.
Every phase moves demand between models; the total stays at ``--utilization`` of the fleet's capacity.

    python -m bench.rebalancing             # full: 1,000 workers, 5 models, 6 phases of 10 minutes
    python -m bench.rebalancing --tiny      # CI: 50 workers, 3 phases of 2 minutes (seconds)
"""

from __future__ import annotations

import argparse
import math
import random
import time
from dataclasses import dataclass
from typing import Any

from loguru import logger

from bench.measure import percentile
from bench.report import Report, Table, Target, num
from bench.script import main_wrapper, parser
from oasst_inference_server.broker import InMemoryBroker
from oasst_inference_server.scheduling.capacity import WorkerCapacity
from oasst_inference_server.scheduling.rebalancer import Rebalancer
from oasst_inference_server.settings import Settings
from tests.support.scheduling_sim import FleetDemand, FleetSimulation, FleetSwitcher, FleetWorker, SimJob

MODELS = ["model-a", "model-b", "model-c", "model-d", "model-e"]
# Seconds each model takes to load on a worker (each worker within +-20 % of it): bigger models, longer.
LOAD_SECONDS = [20.0, 30.0, 45.0, 60.0, 90.0]
# Each phase's share of the arrivals per model (MODELS' order); the fleet starts placed evenly.
PHASES = [
    [0.2, 0.2, 0.2, 0.2, 0.2],
    [0.5, 0.2, 0.1, 0.1, 0.1],
    [0.1, 0.5, 0.2, 0.1, 0.1],
    [0.1, 0.1, 0.1, 0.35, 0.35],
    [0.05, 0.05, 0.1, 0.2, 0.6],
    [0.2, 0.2, 0.2, 0.2, 0.2],
]
TINY_PHASES = [[0.2, 0.2, 0.2, 0.2, 0.2], [0.6, 0.1, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.1, 0.6]]
SPEED = 20.0  # tokens per second per request
PROMPT_TOKENS = (50, 150)
GENERATED_TOKENS = (150, 450)
MAX_NEW_TOKENS = 450
USERS = 500


@dataclass(frozen=True)
class Scenario:
    workers: int
    slots: int
    phase_seconds: float
    phases: list[list[float]]
    utilization: float
    seed: int

    @property
    def mean_service_seconds(self) -> float:
        return (sum(PROMPT_TOKENS) + sum(GENERATED_TOKENS)) / 2 / SPEED

    @property
    def arrivals_per_second(self) -> float:
        return self.utilization * self.workers * self.slots / self.mean_service_seconds


def fleet(scenario: Scenario, rng: random.Random) -> list[FleetWorker]:
    """Workers placed evenly over the models, each able to load every model."""
    return [
        FleetWorker(
            capacity=WorkerCapacity(f"w{i:04}", declared_slots=scenario.slots),
            speed=SPEED,
            model=MODELS[i % len(MODELS)],
            load_seconds={
                m: round(s * rng.uniform(0.8, 1.2), 1) for m, s in zip(MODELS, LOAD_SECONDS, strict=True)
            },
        )
        for i in range(scenario.workers)
    ]


def arrivals(sim: FleetSimulation, scenario: Scenario, rng: random.Random) -> int:
    """Schedule every phase's arrivals (a Poisson stream per model); returns how many."""
    count = 0
    for index, shares in enumerate(scenario.phases):
        start, end = index * scenario.phase_seconds, (index + 1) * scenario.phase_seconds
        for model, share in zip(MODELS, shares, strict=True):
            rate = scenario.arrivals_per_second * share
            at = start + rng.expovariate(rate)
            while at < end:
                job = SimJob(
                    f"j{count}",
                    f"u{rng.randrange(USERS)}",
                    rng.randint(*PROMPT_TOKENS),
                    MAX_NEW_TOKENS,
                    rng.randint(*GENERATED_TOKENS),
                )
                sim.arrive(at, job, model)
                count += 1
                at += rng.expovariate(rate)
    return count


async def simulate(scenario: Scenario, settings: Settings, rebalance: bool) -> dict[str, Any]:
    rng = random.Random(scenario.seed)
    broker = InMemoryBroker(fair_credit=settings.fair_queue_credit_tokens)
    await broker.start()
    started = time.perf_counter()
    try:
        sim = FleetSimulation(broker, settings, fleet(scenario, rng))
        jobs = arrivals(sim, scenario, rng)
        switcher = FleetSwitcher(sim)
        rebalancer = Rebalancer(broker, FleetDemand(sim), settings, switcher, clock=lambda: sim.now)
        interval = settings.rebalance_interval
        end = len(scenario.phases) * scenario.phase_seconds
        rounds, moved_at, capped_at = 0, [], []
        while sim.now < end or not sim.idle:
            await sim.run_until(sim.now + interval)
            if rebalance:
                await sim.publish_sessions()
                made = len(await rebalancer.tick())
                moved_at += [sim.now] * made
                if rebalancer.last_snapshot and made == rebalancer.max_moves(rebalancer.last_snapshot):
                    capped_at.append(sim.now)
                rounds += 1
    finally:
        await broker.close()
    waits = [wait for _, wait, _ in sim.waits]
    phases = []
    for index in range(len(scenario.phases)):
        start, stop = index * scenario.phase_seconds, (index + 1) * scenario.phase_seconds
        in_phase = [wait for arrived, wait, _ in sim.waits if start <= arrived < stop]
        phases.append(
            {
                "jobs": len(in_phase),
                "mean": sum(in_phase) / len(in_phase) if in_phase else None,
                "p99": percentile(in_phase, 99),
                "moves": sum(1 for at in moved_at if start <= at < stop),
                "rounds_at_cap": sum(1 for at in capped_at if start <= at < stop),
            }
        )
    return {
        "rebalance": rebalance,
        "jobs": jobs,
        "finished": sim.finished,
        "wait_mean": sum(waits) / len(waits) if waits else None,
        "wait_p50": percentile(waits, 50),
        "wait_p99": percentile(waits, 99),
        "wait_max": max(waits) if waits else None,
        "moves": len(switcher.orders),
        "rounds": rounds,
        "rounds_at_cap": len(capped_at),
        "loads": sum(w.loads for w in sim.workers.values()),
        "simulated_seconds": sim.now,
        "wall_seconds": time.perf_counter() - started,
        "phases": phases,
    }


def scenario_of(args: argparse.Namespace) -> Scenario:
    return Scenario(
        workers=args.workers or (50 if args.tiny else 1000),
        slots=args.slots,
        phase_seconds=args.phase_seconds or (120.0 if args.tiny else 600.0),
        phases=TINY_PHASES if args.tiny else PHASES,
        utilization=args.utilization,
        seed=args.seed,
    )


def settings_of(args: argparse.Namespace, share: float) -> Settings:
    overrides: dict[str, float] = {
        "rebalance_interval": args.interval,
        "rebalancer_max_moves": args.max_moves,
        "rebalancer_max_moves_share": share,
    }
    if args.cooldown is not None:
        overrides["rebalancer_cooldown"] = args.cooldown
    return Settings(_env_file=None, environment="development", **overrides)  # type: ignore[arg-type]


def seconds(value: object) -> str:
    return "n/a" if value is None else f"{float(value):,.1f}"  # type: ignore[arg-type]


def cap(settings: Settings, workers: int) -> int:
    """A round's most moves for a fleet of ``workers`` switchable workers (``Rebalancer.max_moves``)."""
    return max(settings.rebalancer_max_moves, math.ceil(settings.rebalancer_max_moves_share * workers))


async def run(args: argparse.Namespace) -> Report:
    logger.disable("oasst_inference_server")  # a line per move: thousands in a full run
    scenario = scenario_of(args)
    settings, fixed = settings_of(args, args.max_moves_share), settings_of(args, 0.0)
    report = Report(
        "rebalancing",
        f"12. Rebalancing: {scenario.workers:,} simulated workers, {len(MODELS)} models, shifting demand "
        "(virtual time)",
        args.tiny,
        params={
            "workers": scenario.workers,
            "models": len(MODELS),
            "slots_per_worker": scenario.slots,
            "phases": len(scenario.phases),
            "phase_s": scenario.phase_seconds,
            "utilization": scenario.utilization,
            "arrivals_per_s": round(scenario.arrivals_per_second, 1),
            "rebalance_interval_s": settings.rebalance_interval,
            "max_moves": [cap(settings, scenario.workers), cap(fixed, scenario.workers)],
            "cooldown_s": settings.rebalancer_cooldown,
            "seed": scenario.seed,
        },
    )
    variants = {
        "rebalanced": (
            settings,
            f"rebalanced, {cap(settings, scenario.workers)} moves a round (the defaults)",
        ),
        "rebalanced_fixed": (fixed, f"rebalanced, {cap(fixed, scenario.workers)} moves a round (no share)"),
    }
    runs: dict[str, dict[str, Any]] = {"static": await simulate(scenario, settings, rebalance=False)}
    labels = {"static": "static (placed evenly)"}
    for name, (config, text) in variants.items():
        runs[name] = await simulate(scenario, config, rebalance=True)
        labels[name] = text
    for name, m in runs.items():
        print(f"{labels[name]}: {m['wall_seconds']:.1f} s", flush=True)
    report.metrics = dict(runs)
    table = Table(
        "Queue wait (arrival to a worker), simulated seconds",
        ["fleet", "jobs", "finished", "mean", "p50", "p99", "max", "moves", "run s (wall)"],
    )
    for name, m in runs.items():
        table.rows.append(
            [
                labels[name],
                num(m["jobs"]),
                num(m["finished"]),
                seconds(m["wait_mean"]),
                seconds(m["wait_p50"]),
                seconds(m["wait_p99"]),
                seconds(m["wait_max"]),
                num(m["moves"]),
                f"{m['wall_seconds']:.1f}",
            ]
        )
    report.tables.append(table)
    columns = ["phase", "shares (a-e)", "static mean / p99"]
    columns += [
        f"{cap(c, scenario.workers)} a round: mean / p99 (moves, rounds at the cap)"
        for c, _ in variants.values()
    ]
    phases = Table(
        "Per phase (by arrival): each model's share of the arrivals; queue wait mean / p99, seconds", columns
    )
    for index, shares in enumerate(scenario.phases):
        row = [str(index + 1), " / ".join(f"{s:.0%}" for s in shares)]
        for name, m in runs.items():
            phase = m["phases"][index]
            cell = f"{seconds(phase['mean'])} / {seconds(phase['p99'])}"
            row.append(cell if name == "static" else f"{cell} ({phase['moves']}, {phase['rounds_at_cap']})")
        phases.rows.append(row)
    report.tables.append(phases)
    static, moved = runs["static"], runs["rebalanced"]
    if static["wait_mean"] is not None and moved["wait_mean"] is not None:
        better = moved["wait_mean"] < static["wait_mean"] and moved["wait_p99"] < static["wait_p99"]
        finished = all(m["finished"] == m["jobs"] for m in runs.values())
        report.targets.append(
            Target(
                "rebalancing under shifting demand",
                "mean and p99 queue wait below the static fleet's, every job finished",
                f"mean {seconds(moved['wait_mean'])} s vs {seconds(static['wait_mean'])} s, p99 "
                f"{seconds(moved['wait_p99'])} s vs {seconds(static['wait_p99'])} s static; "
                f"{moved['moves']} moves ({cap(settings, scenario.workers)} a round at most)",
                better and finished,
            )
        )
    report.notes.append(
        "Simulated time: the figures are queue waits in the simulation (seconds a request waits for a slot), "
        "not measurements of this machine; the wall-clock column is what the simulation took to run. Workers "
        f"serve {SPEED:.0f} tokens/s per request, requests of {PROMPT_TOKENS[0]}-{PROMPT_TOKENS[1]} prompt and "
        f"{GENERATED_TOKENS[0]}-{GENERATED_TOKENS[1]} generated tokens ({scenario.mean_service_seconds:.0f} s a "
        f"slot on average); a model loads in {', '.join(f'{s:.0f}' for s in LOAD_SECONDS)} s (+-20 % per "
        "worker), which the workers report and the rebalancer counts as a move's price. Every rebalancer "
        "setting is its default (the second run: but rebalancer_max_moves_share, off)."
    )
    return report


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, help="simulated workers (default 1,000; tiny 50)")
    p.add_argument("--slots", type=int, default=2, help="parallel requests per worker")
    p.add_argument("--phase-seconds", type=float, help="simulated seconds per phase (600; tiny 120)")
    p.add_argument("--utilization", type=float, default=0.75, help="arrivals over the fleet's capacity")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between rebalancing rounds")
    p.add_argument("--max-moves", type=int, default=10, help="rebalancer_max_moves")
    p.add_argument(
        "--max-moves-share",
        type=float,
        default=0.05,
        help="rebalancer_max_moves_share of the first rebalanced run (the second has none)",
    )
    p.add_argument("--cooldown", type=float, help="rebalancer_cooldown (default: the setting's)")
    p.add_argument("--seed", type=int, default=25)
    main_wrapper(run, p.parse_args())


if __name__ == "__main__":
    main()
