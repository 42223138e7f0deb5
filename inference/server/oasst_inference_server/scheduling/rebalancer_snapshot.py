"""The rebalancer's snapshot of the fleet: :class:`.rebalancer_policy.Snapshot` built from the server's state.

* **Workers**: the worker sessions of every replica (the broker). What a session says about switching
  (protocol 6: ``switchable``, ``servable``, each with its measured ``load_seconds``, ``loaded`` and the
  ``switch`` under way) is read by :class:`SwitchFacts`; a session of an older worker cannot switch. A worker is *pinned*
  when its registered worker id or its session id is in ``rebalancer_pinned_workers``. Flagged workers
  (no user work) and draining ones that no move of this rebalancer explains (they are leaving) are left
  out: they are no capacity.
* **Moves under way and cooldowns**: :class:`MoveMemory`, the rebalancer's own record of the moves it
  made. A worker it told to switch counts for its target model (it is on its way) and is not moved again
  until its session shows the target served, or the move timed out.
* **Demand**: per model, the requests waiting (the database, the truth), their estimated tokens (the
  hints of the broker's fair queue, as it counts them), the oldest wait, the arrivals over the window
  and over the longer donor window (a donor is judged by :func:`donor_rate`), the mean service time of
  the requests that completed in the window and the time since the last request (the database,
  :class:`DatabaseDemand`); the running requests, the decode speed and the config's ``keep_alive``
  from the sessions.

May import broker, db, settings, scheduling's policy.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import NamedTuple, Protocol

from sqlalchemy import case, func
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server import events
from oasst_inference_server.broker import Broker, BrokerError, WorkerSession, WorkerSessionRecord
from oasst_inference_server.db.models import DbMessage, utcnow
from oasst_inference_server.scheduling.rebalancer_policy import ModelDemand, Snapshot, WorkerState
from oasst_shared.schemas import MessageState

# The most completed requests read per round to measure service times (the newest of the window).
_SERVICE_SAMPLE = 2000


@dataclass(frozen=True)
class SwitchFacts:
    """What a worker session says about switching (protocol 6): the models it can load (none unless it
    is switchable), their measured load times, whether it holds a model, whether a switch is under way."""

    names: frozenset[str]
    loaded: bool
    switching: bool
    _load_seconds: tuple[tuple[str, float], ...] = ()

    @classmethod
    def of(cls, session: WorkerSession) -> SwitchFacts:
        servable = session.servable if session.switchable else []
        return cls(
            names=frozenset(s.name for s in servable),
            loaded=session.loaded,
            switching=session.switch is not None,
            _load_seconds=tuple((s.name, s.load_seconds) for s in servable if s.load_seconds is not None),
        )

    def load_seconds(self) -> dict[str, float]:
        return dict(self._load_seconds)


@dataclass
class PendingMove:
    to_model: str | None  # None: an unload
    issued_at: float  # the rebalancer's clock
    seen_switching: bool = False  # its session has shown the switch under way


@dataclass
class MoveMemory:
    """The moves this rebalancer made (its clock's seconds): when each worker last moved, and the moves
    its workers have not reported done. Kept by the replica holding the rebalancer lock: a replica that
    takes the lock over starts with none (a worker whose move it does not know of may move again at once)."""

    move_timeout: float
    last_moved: dict[str, float] = field(default_factory=dict)
    pending: dict[str, PendingMove] = field(default_factory=dict)

    def issued(self, session_id: str, to_model: str | None, now: float) -> None:
        self.pending[session_id] = PendingMove(to_model, now)
        self.last_moved[session_id] = now

    def failed(self, session_id: str) -> None:
        """The switcher refused the move: the worker stays where it is (its cooldown runs)."""
        self.pending.pop(session_id, None)

    def settle(self, sessions: Mapping[str, tuple[WorkerSession, SwitchFacts]], now: float) -> None:
        """Forget the moves that are over: done (the session serves the target, or has nothing loaded
        after an unload), failed (the session showed the switch, then serves something else without
        it), timed out, or whose worker left. The cooldown of a worker runs from its move's end."""
        for session_id, move in list(self.pending.items()):
            known = sessions.get(session_id)
            if known is None:
                del self.pending[session_id]
                continue
            session, facts = known
            switching = session.draining or facts.switching
            move.seen_switching = move.seen_switching or switching
            arrived = not switching and _serves(session, facts, move.to_model)
            fell_back = move.seen_switching and not switching
            if arrived or fell_back:
                self.last_moved[session_id] = now
                del self.pending[session_id]
            elif now - move.issued_at > self.move_timeout:
                del self.pending[session_id]
        for session_id in [s for s in self.last_moved if s not in sessions]:
            del self.last_moved[session_id]


def _serves(session: WorkerSession, facts: SwitchFacts, to_model: str | None) -> bool:
    if to_model is None:
        return not facts.loaded
    return facts.loaded and session.model_config_.name == to_model


class Demand(NamedTuple):
    """What the database tells of one model's requests."""

    queued: int = 0
    oldest_wait: float = 0.0
    arrivals: int = 0  # queued within the window
    donor_arrivals: int = 0  # queued within the donor window
    service_seconds: float | None = None  # mean slot time of those that completed in it
    idle_seconds: float = math.inf  # since the last request arrived (ever)


class DemandReader(Protocol):
    async def read(
        self, models: Collection[str], window: float, donor_window: float
    ) -> dict[str, Demand]: ...


class DatabaseDemand:
    """The requests of each model as the database has them: four reads per round, each an index
    range of ``ix_message_state_model_enqueued`` per state and model."""

    def __init__(self, session_factory: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = session_factory

    async def read(self, models: Collection[str], window: float, donor_window: float) -> dict[str, Demand]:
        if not models:
            return {}
        now = utcnow()
        since = now - timedelta(seconds=window)
        since_donor = now - timedelta(seconds=max(window, donor_window))
        queued: dict[str, tuple[int, float]] = {}
        arrivals: dict[str, tuple[int, int]] = {}
        service: dict[str, list[float]] = {}
        names = col(DbMessage.model_config_name)
        generation_states = [s for s in MessageState if s != MessageState.manual]
        async with self._sessions() as session:
            pending = await session.exec(
                select(DbMessage.model_config_name, func.count(), func.min(DbMessage.enqueued_at))
                .where(DbMessage.state == MessageState.pending, names.in_(models))
                .group_by(DbMessage.model_config_name)
            )
            for name, count, oldest in pending.all():
                wait = (now - _aware(oldest)).total_seconds() if oldest is not None else 0.0
                queued[name or ""] = (int(count), max(0.0, wait))
            in_window = func.sum(case((col(DbMessage.enqueued_at) >= since, 1), else_=0))
            arrived = await session.exec(
                select(DbMessage.model_config_name, in_window, func.count())
                .where(
                    col(DbMessage.state).in_(generation_states),
                    names.in_(models),
                    col(DbMessage.enqueued_at) >= since_donor,
                )
                .group_by(DbMessage.model_config_name)
            )
            arrivals = {name or "": (int(short or 0), int(long)) for name, short, long in arrived.all()}
            newest = await session.exec(
                select(DbMessage.model_config_name, func.max(DbMessage.enqueued_at))
                .where(col(DbMessage.state).in_(generation_states), names.in_(models))
                .group_by(DbMessage.model_config_name)
            )
            idle = {
                name or "": max(0.0, (now - _aware(last)).total_seconds())
                for name, last in newest.all()
                if last is not None
            }
            done = await session.exec(
                select(DbMessage.model_config_name, DbMessage.started_at, DbMessage.finished_at)
                .where(
                    DbMessage.state == MessageState.complete,
                    names.in_(models),
                    col(DbMessage.enqueued_at) >= since,
                )
                .order_by(col(DbMessage.enqueued_at).desc())
                .limit(_SERVICE_SAMPLE)
            )
            for name, started, finished in done.all():
                if started is not None and finished is not None:
                    seconds = (_aware(finished) - _aware(started)).total_seconds()
                    if seconds > 0:
                        service.setdefault(name or "", []).append(seconds)
        return {
            model: Demand(
                queued=queued.get(model, (0, 0.0))[0],
                oldest_wait=queued.get(model, (0, 0.0))[1],
                arrivals=arrivals.get(model, (0, 0))[0],
                donor_arrivals=arrivals.get(model, (0, 0))[1],
                service_seconds=statistics.fmean(service[model]) if service.get(model) else None,
                idle_seconds=idle.get(model, math.inf),
            )
            for model in models
        }


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


async def queued_tokens(broker: Broker, model: str) -> float:
    """The estimated tokens of the model's queued hints, as its fair queue counts them (weighted)."""
    try:
        snapshot = await broker.queue_snapshot(events.work_queue_name(model))
    except BrokerError:
        return 0.0
    return sum(hint.cost for hints in snapshot.waiting.values() for hint in hints)


class SessionReader:
    """Reads worker session records with their switching facts, by session id; a record whose bytes
    did not change since the last read keeps what it parsed to (a thousand records take 0.1-0.2 s to
    parse: an idle fleet's records mostly stay the same)."""

    def __init__(self) -> None:
        self._parsed: dict[str, tuple[str, tuple[WorkerSession, SwitchFacts] | None]] = {}

    def read(self, records: Iterable[WorkerSessionRecord]) -> dict[str, tuple[WorkerSession, SwitchFacts]]:
        parsed: dict[str, tuple[str, tuple[WorkerSession, SwitchFacts] | None]] = {}
        sessions: dict[str, tuple[WorkerSession, SwitchFacts]] = {}
        for record in records:
            known = self._parsed.get(record.session_id)
            if known is not None and known[0] == record.data:
                read = known[1]
            else:
                session = WorkerSession.of(record)
                read = (session, SwitchFacts.of(session)) if session is not None else None
            parsed[record.session_id] = (record.data, read)
            if read is not None:
                sessions[record.session_id] = read
        self._parsed = parsed  # sessions gone since the last read are forgotten
        return sessions


def worker_states(
    sessions: Mapping[str, tuple[WorkerSession, SwitchFacts]],
    memory: MoveMemory,
    pinned: Collection[str],
    now: float,
) -> list[WorkerState]:
    states = []
    for session_id, (session, facts) in sessions.items():
        pending = memory.pending.get(session_id)
        if session.flagged or ((session.draining or facts.switching) and pending is None):
            continue
        if pending is not None:
            model = pending.to_model
        else:
            model = session.model_config_.name if facts.loaded else None
        moved = memory.last_moved.get(session_id)
        states.append(
            WorkerState(
                session_id=session_id,
                model=model,
                servable=facts.names,
                slots=session.max_parallel_requests,
                in_flight=len(session.in_flight),
                pinned=session_id in pinned
                or (session.worker_id is not None and session.worker_id in pinned),
                switching=pending is not None,
                since_move=now - moved if moved is not None else float("inf"),
                load_seconds=facts.load_seconds(),
            )
        )
    return states


def model_names(
    sessions: Mapping[str, tuple[WorkerSession, SwitchFacts]], configured: Iterable[str]
) -> set[str]:
    """Every model the round looks at: served, servable, or given a minimum or maximum."""
    names = set(configured)
    for session, facts in sessions.values():
        names.add(session.model_config_.name)
        names |= facts.names
    return names


def upper_rate(count: int, seconds: float) -> float:
    """A high estimate of a Poisson rate from ``count`` arrivals in ``seconds`` (about two standard
    deviations up: a few arrivals say little, thousands say it exactly)."""
    return (count + 2 * math.sqrt(count) + 1) / seconds


def donor_rate(demand: Demand, window: float, donor_window: float) -> float:
    """The arrival rate a model is judged by as a donor: the longer window's, unless the window's count
    is low enough to say surely that traffic fell since (then the window's high estimate), and never
    below the window's own rate. A small fleet's quiet minute is noise; a large one's is news."""
    rate = demand.arrivals / window
    longer = demand.donor_arrivals / max(window, donor_window)
    return max(rate, min(longer, upper_rate(demand.arrivals, window)))


async def build_snapshot(
    broker: Broker,
    demand_reader: DemandReader,
    memory: MoveMemory,
    reader: SessionReader,
    *,
    configured_models: Iterable[str],
    pinned: Collection[str],
    window: float,
    donor_window: float,
    now: float,
) -> Snapshot:
    """One round's snapshot (``now``: the rebalancer's clock, as ``memory`` keeps it)."""
    sessions = reader.read(await broker.list_worker_sessions())
    memory.settle(sessions, now)
    workers = worker_states(sessions, memory, pinned, now)
    names = sorted(model_names(sessions, configured_models))
    demands = await demand_reader.read(names, window, donor_window)
    serving: dict[str, list[WorkerSession]] = {}
    for session, facts in sessions.values():
        if facts.loaded:
            serving.setdefault(session.model_config_.name, []).append(session)
    models: dict[str, ModelDemand] = {}
    for name in names:
        demand = demands.get(name, Demand())
        workers_of = serving.get(name, [])
        speeds = [s.tokens_per_second for s in workers_of if s.tokens_per_second]
        models[name] = ModelDemand(
            name=name,
            queued=demand.queued,
            queued_tokens=await queued_tokens(broker, name) if demand.queued else 0.0,
            oldest_wait=demand.oldest_wait,
            arrivals_per_second=demand.arrivals / window,
            donor_arrivals_per_second=donor_rate(demand, window, donor_window),
            running=sum(len(s.in_flight) for s in workers_of),
            service_seconds=demand.service_seconds,
            tokens_per_second=statistics.median(speeds) if speeds else None,
            idle_seconds=demand.idle_seconds,
            keep_alive=workers_of[0].model_config_.keep_alive if workers_of else 0.0,
        )
    return Snapshot(models=models, workers=workers)
