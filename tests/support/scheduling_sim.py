"""A deterministic simulation of dispatch in virtual time, against a real broker and the server's rules.

The queue is a real broker's fair queue (in-memory or Redis); the tickets and their costs come from
:mod:`oasst_inference_server.dispatch.fair_share`, the worker choice from
:func:`oasst_inference_server.dispatch.capacity.choose_worker`, the corrections go through ``broker.charge``, the
same calls the server's dispatcher and lifecycle make. Only the workers are simulated: each request
runs at a fixed number of tokens per second, so a run is repeatable and time is virtual (the
scheduling tests assert shares and completion times without any wall-clock dependence).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from oasst_inference_server.broker import Broker
from oasst_inference_server.dispatch.capacity import WorkerCapacity, choose_worker
from oasst_inference_server.dispatch.fair_share import Ticket
from oasst_inference_server.settings import Settings


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
