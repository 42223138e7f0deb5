"""A deterministic simulation of dispatch in virtual time, against a real broker and the server's rules.

The queue is a real broker's fair queue (in-memory or Redis); the tickets and their costs come from
:mod:`oasst_inference_server.scheduling.fair_share`, the worker choice from
:func:`oasst_inference_server.scheduling.capacity.choose_worker`, the corrections go through ``broker.charge``, the
same calls the server's dispatcher and lifecycle make. Only the workers are simulated: each request
runs at a fixed number of tokens per second, so a run is repeatable and time is virtual (the
scheduling tests assert shares and completion times without any wall-clock dependence).

:class:`Simulation` is one model's queue and workers. :class:`FleetSimulation` is several models whose
workers switch between them when the server's rebalancer tells them to (its policy, snapshot and loop
run unchanged: the simulation publishes worker sessions to the broker as sockets do and answers the
rebalancer's demand reads as the database would); the rebalancing benchmark runs it with 1,000 workers.
"""

from __future__ import annotations

import bisect
import heapq
import math
import statistics
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from oasst_inference_server import events
from oasst_inference_server.broker import Broker, WorkerSession, WorkerSessionRecord
from oasst_inference_server.broker.worker_session import ServableSummary
from oasst_inference_server.scheduling.capacity import WorkerCapacity, choose_worker
from oasst_inference_server.scheduling.fair_share import Ticket
from oasst_inference_server.scheduling.rebalancer_snapshot import Demand
from oasst_inference_server.settings import Settings
from oasst_shared.model_configs import SMOLLM2_135M, ModelConfig
from oasst_shared.protocol import ServableModel


@dataclass
class SimJob:
    id: str
    user: str
    prompt_tokens: int
    max_new_tokens: int
    generated_tokens: int  # what the simulated backend will really generate
    weight: float = 1.0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.generated_tokens

    def ticket(self) -> Ticket:
        return Ticket(
            user=self.user,
            prompt_tokens=self.prompt_tokens,
            max_new_tokens=self.max_new_tokens,
            weight=self.weight,
        )


@dataclass
class SimWorker:
    capacity: WorkerCapacity
    speed: float  # tokens per second per request
    jobs_done: int = 0
    tokens_done: int = 0


@dataclass
class Dispatch:
    time: float
    job: SimJob
    worker: str
    index: int  # 0-based dispatch count


@dataclass
class Simulation:
    broker: Broker
    settings: Settings
    workers: list[SimWorker]
    queue: str = "work:sim"
    now: float = 0.0
    jobs: dict[str, SimJob] = field(default_factory=dict)
    dispatches: list[Dispatch] = field(default_factory=list)
    finished_at: dict[str, float] = field(default_factory=dict)
    # Called before each dispatch with the job and the worker chosen (tests assert invariants here).
    on_dispatch: Callable[[SimJob, SimWorker], None] | None = None
    _running: list[tuple[float, int, str, str]] = field(default_factory=list)  # (end, seq, job, worker)
    _seq: int = 0

    def worker(self, session_id: str) -> SimWorker:
        return next(w for w in self.workers if w.capacity.session_id == session_id)

    async def submit(self, job: SimJob) -> None:
        self.jobs[job.id] = job
        ticket = job.ticket()
        await self.broker.push_work(
            self.queue, job.id, user=job.user, cost=ticket.estimated_cost(self.settings)
        )

    async def dispatch(self) -> int:
        """Dispatch while a worker has room and jobs wait; returns how many were dispatched."""
        count = 0
        while any(w.capacity.free_slots > 0 for w in self.workers):
            job_id = await self.broker.pop_work(self.queue, 0)
            if job_id is None:
                break
            job = self.jobs[job_id]
            chosen = choose_worker([w.capacity for w in self.workers], job.prompt_tokens + job.max_new_tokens)
            assert chosen is not None  # every simulated worker fits every job
            worker = self.worker(chosen.session_id)
            if self.on_dispatch is not None:
                self.on_dispatch(job, worker)
            assert worker.capacity.in_flight < worker.capacity.declared_slots, "over the declared slots"
            worker.capacity.in_flight += 1
            self.dispatches.append(Dispatch(self.now, job, chosen.session_id, len(self.dispatches)))
            self._seq += 1
            heapq.heappush(
                self._running, (self.now + job.tokens / worker.speed, self._seq, job.id, chosen.session_id)
            )
            count += 1
        return count

    async def complete_next(self) -> bool:
        """Advance virtual time to the next completion and account for it; False if nothing runs."""
        if not self._running:
            return False
        end, _, job_id, session_id = heapq.heappop(self._running)
        started = next(d.time for d in reversed(self.dispatches) if d.job.id == job_id)
        self.now = end
        job = self.jobs[job_id]
        worker = self.worker(session_id)
        worker.capacity.in_flight -= 1
        worker.jobs_done += 1
        worker.tokens_done += job.tokens
        worker.capacity.observe_speed(job.generated_tokens / max(end - started, 1e-9))
        ticket = job.ticket()
        correction = ticket.actual_cost(self.settings, job.prompt_tokens, job.generated_tokens)
        await self.broker.charge(self.queue, job.user, correction - ticket.estimated_cost(self.settings))
        self.finished_at[job_id] = end
        return True

    async def run(self, until_dispatches: int | None = None) -> None:
        """Dispatch and complete until everything finished (or ``until_dispatches`` were made)."""
        while True:
            await self.dispatch()
            if until_dispatches is not None and len(self.dispatches) >= until_dispatches:
                return
            if not await self.complete_next():
                return


def pseudo_random(seed: int) -> Callable[[int, int], int]:
    """A tiny deterministic generator of integers in [low, high] (same numbers on every machine)."""
    state = [seed]

    def draw(low: int, high: int) -> int:
        state[0] = (state[0] * 1103515245 + 12345) % 2**31
        return low + state[0] % (high - low + 1)

    return draw


# ---------------------------------------------------------------- a fleet of several models


@dataclass
class FleetWorker:
    """A simulated worker that can switch models: it drains, then loads for its load time."""

    capacity: WorkerCapacity
    speed: float  # tokens per second per request
    model: str | None  # what it serves (while switching: what it last served)
    load_seconds: dict[str, float]  # its servable models and what loading each takes
    switching_to: str | None = None
    switching: bool = False
    running: set[str] = field(default_factory=set)  # job ids
    loads: int = 0

    @property
    def session_id(self) -> str:
        return self.capacity.session_id


class FleetSimulation:
    """Several models, each with its fair queue in a real broker (the server's queue names), workers
    placed by :func:`choose_worker` among those serving the model, in virtual time; workers switch
    models when told (:class:`FleetSwitcher`, the rebalancer's :class:`ModelSwitcher`). Its state is
    shown to the server's rebalancer as the server has it: worker session records in the broker
    (:meth:`publish_sessions`, with protocol 6's ``servable`` and ``loaded``) and the requests of each
    model (:class:`FleetDemand`, what the database tells the server).

    Arrivals are scheduled with :meth:`arrive`; :meth:`run_until` processes every event up to a time.
    Each dispatch records the job's queue wait (arrival to dispatch) in :attr:`waits`."""

    def __init__(self, broker: Broker, settings: Settings, workers: list[FleetWorker]) -> None:
        self.broker = broker
        self.settings = settings
        self.workers = {w.session_id: w for w in workers}
        # The capacities of the workers serving each model (not switching), as its dispatcher has them.
        self.serving: dict[str, list[WorkerCapacity]] = {}
        self.free: dict[str, int] = {}  # their free slots, kept as jobs start and end
        for worker in workers:
            if worker.model is not None:
                self.serving.setdefault(worker.model, []).append(worker.capacity)
                self.free[worker.model] = self.free.get(worker.model, 0) + worker.capacity.free_slots
        self.worker_of: dict[str, FleetWorker] = {}  # running job -> its worker
        self.now = 0.0
        self.jobs: dict[str, SimJob] = {}
        self.model_of: dict[str, str] = {}
        self.arrived_at: dict[str, float] = {}
        self.waiting: dict[str, dict[str, float]] = {}  # model -> job id -> arrival, oldest first
        self.arrivals: dict[str, list[float]] = {}  # model -> arrival times
        self.service: dict[str, list[tuple[float, float]]] = {}  # model -> (finished at, seconds held)
        self.waits: list[tuple[float, float, str]] = []  # (arrival, wait, model) per dispatched job
        self.finished = 0
        self.switches = 0
        self._events: list[tuple[float, int, str, str]] = []  # (time, seq, kind, id)
        self._seq = 0
        self._configs: dict[str, ModelConfig] = {}
        self._servable: dict[str, list[ServableSummary]] = {}

    # ------------------------------------------------------------ events
    def _at(self, time: float, kind: str, key: str) -> None:
        self._seq += 1
        heapq.heappush(self._events, (time, self._seq, kind, key))

    def arrive(self, time: float, job: SimJob, model: str) -> None:
        self.jobs[job.id] = job
        self.model_of[job.id] = model
        self._at(time, "arrive", job.id)

    async def run_until(self, until: float) -> None:
        while self._events and self._events[0][0] <= until:
            time, _, kind, key = heapq.heappop(self._events)
            self.now = time
            if kind == "arrive":
                await self._submit(key)
            elif kind == "finish":
                await self._finish(key)
            else:
                await self._loaded(key)
        self.now = max(self.now, until)

    @property
    def idle(self) -> bool:
        return not self._events

    # ------------------------------------------------------------ jobs
    async def _submit(self, job_id: str) -> None:
        job, model = self.jobs[job_id], self.model_of[job_id]
        self.arrived_at[job_id] = self.now
        self.arrivals.setdefault(model, []).append(self.now)
        self.waiting.setdefault(model, {})[job_id] = self.now
        cost = job.ticket().estimated_cost(self.settings)
        await self.broker.push_work(events.work_queue_name(model), job_id, user=job.user, cost=cost)
        await self.dispatch(model)

    async def dispatch(self, model: str) -> None:
        capacities = self.serving.get(model, [])
        while self.free.get(model, 0) > 0:
            popped = await self.broker.pop_work(events.work_queue_name(model), 0)
            if popped is None:
                return
            job = self.jobs[popped]
            chosen = choose_worker(capacities, job.prompt_tokens + job.max_new_tokens)
            assert chosen is not None, "every simulated worker fits every job"
            worker = self.workers[chosen.session_id]
            assert worker.model == model and not worker.switching
            chosen.in_flight += 1
            self.free[model] -= 1
            worker.running.add(popped)
            self.worker_of[popped] = worker
            del self.waiting[model][popped]
            self.waits.append((self.arrived_at[popped], self.now - self.arrived_at[popped], model))
            self._at(self.now + job.tokens / worker.speed, "finish", popped)

    async def _finish(self, job_id: str) -> None:
        job, model = self.jobs[job_id], self.model_of[job_id]
        worker = self.worker_of.pop(job_id)
        worker.running.discard(job_id)
        worker.capacity.in_flight -= 1
        held = job.tokens / worker.speed
        worker.capacity.observe_speed(job.generated_tokens / held)
        self.service.setdefault(model, []).append((self.now, held))
        ticket = job.ticket()
        correction = ticket.actual_cost(self.settings, job.prompt_tokens, job.generated_tokens)
        await self.broker.charge(
            events.work_queue_name(model), job.user, correction - ticket.estimated_cost(self.settings)
        )
        self.finished += 1
        del self.jobs[job_id], self.model_of[job_id], self.arrived_at[job_id]
        if worker.switching and not worker.running:
            self._start_loading(worker)
        elif not worker.switching:
            self.free[model] += 1
            await self.dispatch(model)

    # ------------------------------------------------------------ switching
    def switch(self, session_id: str, to_model: str | None) -> None:
        """Drain, then (after the load time) serve ``to_model``; None: drain and unload."""
        worker = self.workers[session_id]
        if worker.switching or (to_model is not None and to_model not in worker.load_seconds):
            raise ValueError(f"worker {session_id} cannot switch to {to_model}")
        worker.switching, worker.switching_to = True, to_model
        if worker.model is not None:
            self.serving[worker.model].remove(worker.capacity)
            self.free[worker.model] -= worker.capacity.free_slots
        self.switches += 1
        if not worker.running:
            self._start_loading(worker)

    def _start_loading(self, worker: FleetWorker) -> None:
        to = worker.switching_to
        self._at(self.now + (worker.load_seconds[to] if to is not None else 0.0), "loaded", worker.session_id)

    async def _loaded(self, session_id: str) -> None:
        worker = self.workers[session_id]
        worker.model, worker.switching, worker.loads = worker.switching_to, False, worker.loads + 1
        worker.capacity.tokens_per_second = None  # a new model: its speed is measured afresh
        if worker.model is not None:
            self.serving.setdefault(worker.model, []).append(worker.capacity)
            self.free[worker.model] = self.free.get(worker.model, 0) + worker.capacity.free_slots
            await self.dispatch(worker.model)

    # ------------------------------------------------------------ what the server sees
    async def publish_sessions(self) -> None:
        """Every worker's session record, as its socket would publish it (protocol 6 included)."""
        for worker in self.workers.values():
            await self.broker.put_worker_session(self._record(worker), ttl=10**9)

    def _record(self, worker: FleetWorker) -> WorkerSessionRecord:
        serves = worker.model or next(iter(sorted(worker.load_seconds)))
        session = WorkerSession(
            model_config=self._config(serves),
            max_parallel_requests=worker.capacity.declared_slots,
            free_slots=worker.capacity.free_slots if not worker.switching else 0,
            in_flight=sorted(worker.running),
            backend_kind="simulated",
            draining=worker.switching,
            connected_at=0.0,
            tokens_per_second=worker.capacity.tokens_per_second,
        )
        # Protocol 6's fields (the servable list made once per worker).
        servable = self._servable.get(worker.session_id)
        if servable is None:
            servable = self._servable[worker.session_id] = [
                ServableSummary.of(ServableModel(config=self._config(name), load_seconds=seconds))
                for name, seconds in sorted(worker.load_seconds.items())
            ]
        session.switchable, session.servable, session.loaded = True, servable, worker.model is not None
        return session.record(worker.session_id)

    def _config(self, name: str) -> ModelConfig:
        config = self._configs.get(name)
        if config is None:
            config = self._configs[name] = SMOLLM2_135M.model_copy(update={"name": name})
        return config


class FleetSwitcher:
    """The rebalancer's :class:`ModelSwitcher` for a :class:`FleetSimulation`: the order takes effect
    at once (the worker starts draining)."""

    def __init__(self, sim: FleetSimulation) -> None:
        self.sim = sim
        self.orders: list[tuple[str, str | None, str]] = []

    async def load(self, session_id: str, model_config_name: str, reason: str) -> None:
        self.sim.switch(session_id, model_config_name)
        self.orders.append((session_id, model_config_name, reason))

    async def unload(self, session_id: str, reason: str) -> None:
        self.sim.switch(session_id, None)
        self.orders.append((session_id, None, reason))


class FleetDemand:
    """The rebalancer's :class:`DemandReader` for a :class:`FleetSimulation`: what the server reads from
    its database (waiting requests, the oldest wait, arrivals and service times over the window)."""

    def __init__(self, sim: FleetSimulation) -> None:
        self.sim = sim

    async def read(self, models: Collection[str], window: float, donor_window: float) -> dict[str, Demand]:
        sim, since = self.sim, self.sim.now - window
        since_donor = sim.now - max(window, donor_window)
        demands = {}
        for model in models:
            waiting = sim.waiting.get(model, {})
            oldest = next(iter(waiting.values()), sim.now)
            arrivals = sim.arrivals.get(model, [])
            service = sim.service.get(model, [])
            recent = [held for at, held in service[bisect.bisect_left(service, (since, 0.0)) :]]
            demands[model] = Demand(
                queued=len(waiting),
                oldest_wait=sim.now - oldest,
                arrivals=len(arrivals) - bisect.bisect_left(arrivals, since),
                donor_arrivals=len(arrivals) - bisect.bisect_left(arrivals, since_donor),
                service_seconds=statistics.fmean(recent) if recent else None,
                idle_seconds=sim.now - arrivals[-1] if arrivals else math.inf,
            )
        return demands
