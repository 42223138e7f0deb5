"""The rebalancer's policy: which switchable workers move to which model in one round (a pure function).

:func:`plan_moves` takes a :class:`Snapshot` (per model: its queue, arrivals and running requests; per
worker: what it has loaded, what it can load, at what measured cost, whether it is busy, pinned or was
moved lately) and :class:`PolicySettings`, and returns the :class:`Move` list of the round, each with its
reason in words. It reads no clock and no state: the same snapshot gives the same moves.

Every model is measured in *slots* (a slot runs one request at a time). A request holds a slot for the
model's service time ``T`` (measured, else its queued tokens at the measured speed, else a default). A
model's **load** is ``max(arrivals x T, running) + queued x T / backlog_seconds``: what its steady
traffic keeps busy, plus what clearing its queue within ``backlog_seconds`` takes. Its **utilization** is
that load over the slots of its workers (those switching to it counted: they are on their way). As a
donor, a model's load takes the rate it is judged by as a donor where higher
(``donor_arrivals_per_second``: its rate over a longer window, unless the last window's count says
surely that its traffic fell): a receiver follows its measured traffic at once, a donor gives only what
its traffic surely leaves idle. Thousands of arrivals a window make the two equal; a handful (a small
fleet) make the difference that keeps it from chasing noise.

The rules, in the order a round applies them, one move at a time (each move updates the counts the next
one sees), at most ``max_moves`` a round and one per worker:

1. **Minimum**: a model with fewer workers than its minimum gets one, from a donor that stays at or
   above its own minimum (an unloaded worker first, then the least utilized donor), whatever the demand.
2. **Demand**: a *starved* model (utilization above ``starved_utilization``, or requests and no worker)
   below its maximum gets a worker from an *over-served* one: a donor whose utilization after giving
   stays at or below ``donor_utilization`` (or one above its maximum), and at or above its minimum; a
   model keeps its last worker until it was idle for its config's ``keep_alive`` (null: it stays loaded;
   its next request would otherwise wait for a whole load). An unloaded worker goes before a loaded
   one, at the same price. The
   move must be worth its cost: the worker's measured load time for the model (plus, for a busy worker,
   one service time to drain). Its *gain* is the time it would spend taking over the receiver's queue
   once loaded, until the queue clears or the ``horizon`` ends (in a fluid model of the queue: arrivals
   against the service rate of its workers); a move is made only if the gain exceeds the cost (for a
   model with requests and no worker, always). Among starved models the largest net gain goes first;
   for each, the cheapest worker to load it.
3. **Maximum**: a model above its maximum that no starved model took a worker from has one unloaded.

Switchable means: it lists the receiving model as servable, is not pinned, is not being switched, and
its last move is at least ``cooldown`` seconds ago. Busy workers are drainable (they finish what they
hold first). No flapping: a receiver was above ``starved_utilization`` and a donor ends at or below
``donor_utilization``, so a move cannot be undone by the next round's rules while demand holds, and the
cooldown bounds how often any worker moves when it does not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

MoveKind = Literal["minimum", "demand", "maximum"]


@dataclass(frozen=True)
class ModelDemand:
    """What one model is asked for (one round's snapshot)."""

    name: str
    queued: int = 0  # requests waiting in its queue
    queued_tokens: float = 0.0  # their estimated tokens, as the fair queue counts them
    oldest_wait: float = 0.0  # seconds the oldest of them has waited
    arrivals_per_second: float = 0.0  # requests queued for it per second over the window
    # The rate a donor is judged by, where known (the snapshot's ``donor_rate``: no lower than the
    # measured one, higher where a quiet window may be noise).
    donor_arrivals_per_second: float | None = None
    running: int = 0  # requests its workers run now
    service_seconds: float | None = None  # mean seconds a request holds a slot, where measured
    tokens_per_second: float | None = None  # decode speed per request on its workers, where measured
    idle_seconds: float = math.inf  # since its last request arrived
    # Its config's keep_alive: how long it stays loaded once idle (None: for ever). The last worker of a
    # model leaves for another only once the model was idle this long.
    keep_alive: float | None = 0.0


@dataclass(frozen=True)
class WorkerState:
    """One worker as the policy sees it."""

    session_id: str
    model: str | None  # what it serves, or is being switched to (``switching``); None: nothing loaded
    servable: frozenset[str] = frozenset()
    slots: int = 1
    in_flight: int = 0
    pinned: bool = False
    switching: bool = False  # a move under way: counted for its target, never moved again meanwhile
    since_move: float = math.inf  # seconds since its last move
    load_seconds: Mapping[str, float] = field(default_factory=dict)  # measured, per servable model


@dataclass(frozen=True)
class Snapshot:
    models: Mapping[str, ModelDemand]
    workers: Sequence[WorkerState]


@dataclass(frozen=True)
class PolicySettings:
    min_workers: Mapping[str, int] = field(default_factory=dict)
    max_workers: Mapping[str, int] = field(default_factory=dict)
    default_min_workers: int = 0
    default_max_workers: int | None = None  # None: no maximum
    cooldown: float = 120.0  # seconds a worker stays where it was moved
    max_moves: int = 10  # per round
    starved_utilization: float = 1.0
    donor_utilization: float = 0.7
    backlog_seconds: float = 30.0  # a queue should clear within this
    horizon: float = 300.0  # demand is assumed to hold this long: a move pays back within it
    default_load_seconds: float = 60.0  # a worker's load time for a model it never loaded
    default_service_seconds: float = 10.0  # a request's slot time where nothing tells
    default_tokens_per_second: float = 20.0

    def minimum(self, model: str) -> int:
        return self.min_workers.get(model, self.default_min_workers)

    def maximum(self, model: str) -> float:
        most = self.max_workers.get(model, self.default_max_workers)
        return math.inf if most is None else most


@dataclass(frozen=True)
class Move:
    session_id: str
    from_model: str | None  # None: it had nothing loaded
    to_model: str | None  # None: unload
    kind: MoveKind
    reason: str
    cost_seconds: float = 0.0  # its load time (and drain), as the policy priced it


def plan_moves(snapshot: Snapshot, settings: PolicySettings) -> list[Move]:
    """The moves of one round, in the order to make them (see the module docstring)."""
    fleet = _Fleet(snapshot, settings)
    moves: list[Move] = []
    while len(moves) < settings.max_moves:
        move = fleet.restore_minimum() or fleet.serve_demand() or fleet.enforce_maximum()
        if move is None:
            break
        fleet.apply(move)
        moves.append(move)
    return moves


def demand_and_capacity(snapshot: Snapshot, settings: PolicySettings) -> dict[str, tuple[float, int]]:
    """Per model: the slots its traffic and queue need (its load) and the slots of its workers."""
    fleet = _Fleet(snapshot, settings)
    return {model: (fleet.load(model), fleet.count[model].slots) for model in fleet.demand}


@dataclass
class _Count:
    workers: int = 0
    slots: int = 0


class _Fleet:
    """The round's working state: the snapshot with the moves made so far applied to the counts."""

    def __init__(self, snapshot: Snapshot, settings: PolicySettings) -> None:
        self.settings = settings
        self.workers = sorted(snapshot.workers, key=lambda w: w.session_id)
        names = set(snapshot.models) | set(settings.min_workers)
        names |= {w.model for w in self.workers if w.model is not None}
        self.demand = {name: snapshot.models.get(name) or ModelDemand(name) for name in sorted(names)}
        self.count = {name: _Count() for name in self.demand}
        for worker in self.workers:
            if worker.model is not None:
                self.count[worker.model].workers += 1
                self.count[worker.model].slots += worker.slots
        self.moved: set[str] = set()
        # The demand side is fixed for the round (only the counts move): measured once.
        self._service: dict[str, float] = {}
        self._load = {name: self._measure(d, d.arrivals_per_second) for name, d in self.demand.items()}
        self._donor_load = {
            name: self._measure(d, max(d.arrivals_per_second, d.donor_arrivals_per_second or 0.0))
            for name, d in self.demand.items()
        }

    # ------------------------------------------------------------ estimates
    def service_seconds(self, model: str) -> float:
        return self._service[model]

    def load(self, model: str) -> float:
        """Slots the model needs: its steady traffic plus clearing its queue within backlog_seconds."""
        return self._load[model]

    def donor_load(self, model: str) -> float:
        """:meth:`load` with the rate it is judged by as a donor, where higher."""
        return self._donor_load[model]

    def _service_seconds(self, demand: ModelDemand) -> float:
        if demand.service_seconds:
            return demand.service_seconds
        if demand.queued and demand.queued_tokens:
            speed = demand.tokens_per_second or self.settings.default_tokens_per_second
            return demand.queued_tokens / demand.queued / speed
        return self.settings.default_service_seconds

    def _measure(self, demand: ModelDemand, arrivals_per_second: float) -> float:
        service = self._service.setdefault(demand.name, self._service_seconds(demand))
        steady = max(arrivals_per_second * service, float(demand.running))
        return steady + demand.queued * service / self.settings.backlog_seconds

    def utilization(self, model: str, slots: int, *, donor: bool = False) -> float:
        load = self.donor_load(model) if donor else self.load(model)
        if slots <= 0:
            return math.inf if load > 0 else 0.0
        return load / slots

    def starved(self, model: str) -> bool:
        demand, count = self.demand[model], self.count[model]
        if count.workers >= self.settings.maximum(model):
            return False
        if count.slots == 0:
            return demand.queued > 0 or demand.arrivals_per_second > 0
        return self.utilization(model, count.slots) > self.settings.starved_utilization

    def cost(self, worker: WorkerState, model: str) -> float:
        load = worker.load_seconds.get(model, self.settings.default_load_seconds)
        drain = self.service_seconds(worker.model) if worker.in_flight and worker.model else 0.0
        return load + drain

    def gain(self, worker: WorkerState, model: str, cost: float) -> float:
        """Seconds the worker, ready after ``cost``, would spend on the model's queue before it clears
        (a fluid model: arrivals against the service rate of its workers), within the horizon; infinite
        where no worker serves the model (its requests would wait for ever)."""
        demand, service = self.demand[model], self.service_seconds(model)
        if self.count[model].slots == 0:
            return math.inf if demand.queued > 0 or demand.arrivals_per_second > 0 else 0.0
        horizon = self.settings.horizon
        if cost >= horizon:
            return 0.0
        rate = self.count[model].slots / service  # requests served per second now
        extra = worker.slots / service
        excess = demand.arrivals_per_second - rate
        backlog = demand.queued + excess * cost  # requests waiting when the worker is ready
        if backlog <= 0:
            return 0.0
        if excess - extra >= 0:
            return horizon - cost  # the queue outlasts the horizon even with this worker
        return min(backlog / (extra - excess), horizon - cost)

    # ------------------------------------------------------------ who may move
    def switchable(self, worker: WorkerState, to_model: str) -> bool:
        return (
            worker.session_id not in self.moved
            and not worker.pinned
            and not worker.switching
            and worker.model != to_model
            and to_model in worker.servable
            and worker.since_move >= self.settings.cooldown
        )

    def after_giving(self, worker: WorkerState) -> float:
        """The donor model's utilization once ``worker`` left it (0 for an unloaded worker)."""
        if worker.model is None:
            return 0.0
        return self.utilization(worker.model, self.count[worker.model].slots - worker.slots, donor=True)

    def may_give(self, worker: WorkerState, *, for_demand: bool) -> bool:
        model = worker.model
        if model is None:
            return True
        count = self.count[model].workers
        if count - 1 < self.settings.minimum(model):
            return False
        if not for_demand or count > self.settings.maximum(model):
            return True
        if count == 1 and self.kept_alive(model):
            return False  # its next request would wait for a whole load
        return self.after_giving(worker) <= self.settings.donor_utilization

    def kept_alive(self, model: str) -> bool:
        """Whether the model stays loaded: asked for within its keep-alive (None: always)."""
        demand = self.demand[model]
        if demand.queued or demand.running:
            return True
        return demand.keep_alive is None or demand.idle_seconds < demand.keep_alive

    # ------------------------------------------------------------ the three rules
    def restore_minimum(self) -> Move | None:
        short = [
            m
            for m in self.demand
            if self.count[m].workers < min(self.settings.minimum(m), self.settings.maximum(m))
        ]
        for model in sorted(short, key=lambda m: (self.count[m].workers, m)):
            donors = [
                w for w in self.workers if self.switchable(w, model) and self.may_give(w, for_demand=False)
            ]
            if not donors:
                continue
            worker = min(
                donors,
                key=lambda w: (w.model is not None, self.after_giving(w), self.cost(w, model), w.session_id),
            )
            have = self.count[model].workers
            reason = (
                f"restore the minimum of {model} ({self.settings.minimum(model)} worker"
                f"{_s(self.settings.minimum(model))}, it has {have}); {self._donor_words(worker)}; "
                f"load {self.cost(worker, model):.0f} s"
            )
            return Move(worker.session_id, worker.model, model, "minimum", reason, self.cost(worker, model))
        return None

    def serve_demand(self) -> Move | None:
        best: tuple[float, float, str, WorkerState, float, float] | None = None
        for model in self.demand:
            if not self.starved(model):
                continue
            options = []
            for worker in self.workers:
                if not self.switchable(worker, model) or not self.may_give(worker, for_demand=True):
                    continue
                cost = self.cost(worker, model)
                gain = self.gain(worker, model, cost)
                if gain > cost:
                    rank = (cost, worker.model is not None, self.after_giving(worker), worker.session_id)
                    options.append((rank, worker, gain))
            if not options:
                continue
            (cost, *_), worker, gain = min(options, key=lambda o: o[0])
            key = (-(gain - cost), -self.demand[model].oldest_wait, model, worker, cost, gain)
            if best is None or key[:3] < best[:3]:
                best = key
        if best is None:
            return None
        _, _, model, worker, cost, gain = best
        if math.isinf(gain):
            worth = f"loaded in {cost:.0f} s, it serves requests nobody serves"
        else:
            until = "the horizon" if gain >= self.settings.horizon - cost else "it clears"
            worth = f"loaded in {cost:.0f} s, it would take {gain:.0f} s of the queue until {until}"
        reason = f"{self._starved_words(model)}; {self._donor_words(worker)}; {worth}"
        return Move(worker.session_id, worker.model, model, "demand", reason, cost)

    def enforce_maximum(self) -> Move | None:
        for model in self.demand:
            most = self.settings.maximum(model)
            if self.count[model].workers <= most:
                continue
            workers = [
                w
                for w in self.workers
                if w.model == model
                and w.session_id not in self.moved
                and not w.pinned
                and not w.switching
                and w.since_move >= self.settings.cooldown
            ]
            if not workers:
                continue
            worker = min(workers, key=lambda w: (w.in_flight, w.session_id))
            reason = (
                f"{model} has {self.count[model].workers} workers, above its maximum of {most:.0f}, "
                "and no starved model takes one: unload it"
            )
            return Move(worker.session_id, model, None, "maximum", reason)
        return None

    def apply(self, move: Move) -> None:
        worker = next(w for w in self.workers if w.session_id == move.session_id)
        self.moved.add(worker.session_id)
        if move.from_model is not None:
            self.count[move.from_model].workers -= 1
            self.count[move.from_model].slots -= worker.slots
        if move.to_model is not None:
            self.count[move.to_model].workers += 1
            self.count[move.to_model].slots += worker.slots

    # ------------------------------------------------------------ reasons in words
    def _starved_words(self, model: str) -> str:
        demand, count = self.demand[model], self.count[model]
        what = (
            f"{model} is starved: {demand.queued} queued ({demand.queued_tokens:,.0f} tokens), "
            f"oldest waiting {demand.oldest_wait:.0f} s, {demand.arrivals_per_second:.2f} arrivals/s, "
        )
        if count.slots == 0:
            return what + "no worker"
        return what + (
            f"needs {self.load(model):.1f} slots, has {count.slots} on {count.workers} worker"
            f"{_s(count.workers)} ({self.utilization(model, count.slots):.0%})"
        )

    def _donor_words(self, worker: WorkerState) -> str:
        if worker.model is None:
            return f"worker {worker.session_id} has nothing loaded"
        left = self.count[worker.model].workers - 1
        busy = f", draining {worker.in_flight} request{_s(worker.in_flight)}" if worker.in_flight else ""
        return (
            f"worker {worker.session_id} leaves {worker.model}{busy} "
            f"({left} worker{_s(left)} left at {self.after_giving(worker):.0%})"
        )


def _s(count: int) -> str:
    return "" if count == 1 else "s"
