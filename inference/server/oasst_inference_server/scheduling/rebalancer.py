"""The rebalancer: every ``rebalance_interval`` seconds, on one replica at a time (the broker lock
``rebalancer``), it builds a snapshot of demand and workers (:mod:`.rebalancer_snapshot`), asks the
policy for the round's moves (:mod:`.rebalancer_policy`) and makes them through a :class:`ModelSwitcher`
(which tells the workers to load or unload, protocol 6). It keeps its last decisions with their reasons
for the admin view (:attr:`Rebalancer.decisions`) and exports metrics: the moves made, and per model the
slots its demand needs against the slots of its workers.

May import broker, db, settings, metrics and scheduling's policy and snapshot; not workers or anything
above (the switcher is given to it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
import uuid
from collections import deque
from collections.abc import Callable
from datetime import datetime
from typing import Literal, Protocol

from loguru import logger
from pydantic import BaseModel, ConfigDict, Field

from oasst_inference_server import metrics
from oasst_inference_server.broker import Broker
from oasst_inference_server.db.models import utcnow
from oasst_inference_server.scheduling.rebalancer_policy import (
    Move,
    MoveKind,
    PolicySettings,
    Snapshot,
    demand_and_capacity,
    plan_moves,
)
from oasst_inference_server.scheduling.rebalancer_snapshot import (
    DemandReader,
    MoveMemory,
    SessionReader,
    build_snapshot,
)
from oasst_inference_server.settings import Settings

LOCK_NAME = "rebalancer"
DECISIONS_KEPT = 200
# How long a round waits for the switcher to take one order; a call still running then goes on in the
# background (a switcher may answer only once the switch is done) and the round moves on.
SWITCH_CALL_WAIT = 5.0


class ModelSwitcher(Protocol):
    """Tells a worker to switch (implemented by the worker sockets: a ``load_model`` / ``unload_model``
    frame to the worker, through whichever replica holds its socket)."""

    async def load(self, session_id: str, model_config_name: str, reason: str) -> None: ...

    async def unload(self, session_id: str, reason: str) -> None: ...


class Decision(BaseModel):
    """One move of a round, as the admin view shows it."""

    model_config = ConfigDict(frozen=True)

    at: datetime = Field(description="When the round decided it.")
    session_id: str = Field(description="The worker session moved.")
    from_model: str | None = Field(description="The model it left (null: it had none loaded).")
    to_model: str | None = Field(description="The model it loads (null: it unloads).")
    kind: MoveKind = Field(description="The rule: minimum, demand or maximum.")
    reason: str = Field(description="Why, in words, with the figures the round saw.")
    outcome: Literal["sent", "failed"] = Field(description="Whether the switcher took the order.")
    error: str | None = Field(None, description="Why it did not.")


class ModelBalance(BaseModel):
    """One model as the last round saw it."""

    model_config_name: str
    demand_slots: float = Field(description="Slots its traffic and queue need (its load).")
    capacity_slots: int = Field(description="Slots of its workers, those switching to it included.")
    workers: int
    queued: int
    arrivals_per_second: float


class RebalancerStatus(BaseModel):
    """What the admin view shows of the rebalancer."""

    model_config = ConfigDict(protected_namespaces=())

    enabled: bool
    rebalancing_here: bool = Field(description="Whether this replica ran the last round (it holds the lock).")
    models: list[ModelBalance] = Field(default_factory=list)
    decisions: list[Decision] = Field(default_factory=list, description="The latest last.")


def policy_settings(settings: Settings) -> PolicySettings:
    return PolicySettings(
        min_workers=dict(settings.rebalancer_min_workers),
        max_workers=dict(settings.rebalancer_max_workers),
        default_min_workers=settings.rebalancer_default_min_workers,
        cooldown=settings.rebalancer_cooldown,
        max_moves=settings.rebalancer_max_moves,
        starved_utilization=settings.rebalancer_starved_utilization,
        donor_utilization=settings.rebalancer_donor_utilization,
        backlog_seconds=settings.rebalancer_backlog_seconds,
        horizon=settings.rebalancer_horizon,
        default_load_seconds=settings.rebalancer_default_load_seconds,
    )


class Rebalancer:
    def __init__(
        self,
        broker: Broker,
        demand: DemandReader,
        settings: Settings,
        switcher: ModelSwitcher,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``demand``: the requests of each model (:class:`.rebalancer_snapshot.DatabaseDemand` in the
        server); ``clock``: seconds, for cooldowns and move timeouts (virtual time in simulations)."""
        self._broker = broker
        self._settings = settings
        self._switcher = switcher
        self._demand = demand
        self._clock = clock
        self.policy = policy_settings(settings)
        self.memory = MoveMemory(move_timeout=settings.rebalancer_move_timeout)
        self._sessions = SessionReader()
        self.owner = f"replica-{uuid.uuid4().hex[:12]}"
        self.stopping = asyncio.Event()
        self.decisions: deque[Decision] = deque(maxlen=DECISIONS_KEPT)
        self.last_snapshot: Snapshot | None = None
        self._gauged: set[str] = set()
        self._calls: set[asyncio.Task[str | None]] = set()

    @property
    def enabled(self) -> bool:
        return self._settings.rebalance_interval > 0

    async def run(self) -> None:
        """Rounds every ``rebalance_interval`` while this replica holds the lock, until :meth:`stop`."""
        interval = self._settings.rebalance_interval
        if interval <= 0:
            return
        while not self.stopping.is_set():
            try:
                if await self._broker.acquire_lock(LOCK_NAME, self.owner, ttl=interval * 3):
                    await self.tick()
                else:
                    self._forget()  # another replica rebalances: its memory and gauges count
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a broker or database outage must not end the loop
                logger.warning("rebalancing round failed: {}: {}", type(exc).__name__, exc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), timeout=interval)

    async def stop(self) -> None:
        """End the loop's rounds and switcher calls, and give the lock back."""
        self.stopping.set()
        for call in list(self._calls):
            call.cancel()
        if self._calls:
            await asyncio.wait(self._calls, timeout=3.0)
        with contextlib.suppress(Exception):
            await self._broker.release_lock(LOCK_NAME, self.owner)

    async def tick(self) -> list[Decision]:
        """One round (the caller holds the lock): snapshot, plan, make the moves."""
        now = self._clock()
        snapshot = await build_snapshot(
            self._broker,
            self._demand,
            self.memory,
            self._sessions,
            configured_models=[*self.policy.min_workers, *self.policy.max_workers],
            pinned=set(self._settings.rebalancer_pinned_workers),
            window=self._settings.rebalancer_arrival_window,
            donor_window=self._settings.rebalancer_donor_window,
            now=now,
        )
        self.last_snapshot = snapshot
        self._export(snapshot)
        policy = dataclasses.replace(self.policy, max_moves=self.max_moves(snapshot))
        decisions = [await self._make(move, now) for move in plan_moves(snapshot, policy)]
        self.decisions.extend(decisions)
        return decisions

    def max_moves(self, snapshot: Snapshot) -> int:
        """This round's cap: ``rebalancer_max_moves``, or its share of the switchable workers."""
        switchable = sum(1 for w in snapshot.workers if w.servable and not w.pinned)
        share = math.ceil(self._settings.rebalancer_max_moves_share * switchable)
        return max(self._settings.rebalancer_max_moves, share)

    async def _make(self, move: Move, now: float) -> Decision:
        logger.info(
            "rebalancer: worker {} {} -> {}: {}",
            move.session_id,
            move.from_model or "(nothing)",
            move.to_model or "(unload)",
            move.reason,
        )
        self.memory.issued(move.session_id, move.to_model, now)
        call = asyncio.create_task(self._switch(move), name=f"switch {move.session_id}")
        self._calls.add(call)
        call.add_done_callback(self._calls.discard)
        done, _ = await asyncio.wait({call}, timeout=SWITCH_CALL_WAIT)
        error = call.result() if done else None
        return Decision(
            at=utcnow(),
            session_id=move.session_id,
            from_model=move.from_model,
            to_model=move.to_model,
            kind=move.kind,
            reason=move.reason,
            outcome="failed" if error else "sent",
            error=error,
        )

    async def _switch(self, move: Move) -> str | None:
        """Give the switcher its order; the error in words if it refused (the worker left, or cannot)."""
        try:
            if move.to_model is None:
                await self._switcher.unload(move.session_id, move.reason)
            else:
                await self._switcher.load(move.session_id, move.to_model, move.reason)
        except Exception as exc:  # the worker stays where it is, under its cooldown
            error = f"{type(exc).__name__}: {exc}"
            self.memory.failed(move.session_id)
            logger.warning("rebalancer: worker {} was not switched: {}", move.session_id, error)
            metrics.REBALANCER_MOVES.labels(
                move.from_model or "none", move.to_model or "none", move.kind, "failed"
            ).inc()
            return error
        metrics.REBALANCER_MOVES.labels(
            move.from_model or "none", move.to_model or "none", move.kind, "sent"
        ).inc()
        return None

    def status(self) -> RebalancerStatus:
        """The last round's view of each model (on the replica that ran it) and the latest decisions."""
        snapshot = self.last_snapshot
        models = []
        if snapshot is not None:
            counts: dict[str, int] = {}
            for worker in snapshot.workers:
                if worker.model is not None:
                    counts[worker.model] = counts.get(worker.model, 0) + 1
            for model, (demand, capacity) in demand_and_capacity(snapshot, self.policy).items():
                seen = snapshot.models.get(model)
                models.append(
                    ModelBalance(
                        model_config_name=model,
                        demand_slots=round(demand, 2),
                        capacity_slots=capacity,
                        workers=counts.get(model, 0),
                        queued=seen.queued if seen else 0,
                        arrivals_per_second=round(seen.arrivals_per_second, 3) if seen else 0.0,
                    )
                )
        return RebalancerStatus(
            enabled=self.enabled,
            rebalancing_here=snapshot is not None,
            models=models,
            decisions=list(self.decisions),
        )

    def _export(self, snapshot: Snapshot) -> None:
        measured = demand_and_capacity(snapshot, self.policy)
        for model in self._gauged - set(measured):
            metrics.REBALANCER_DEMAND_SLOTS.remove(model)
            metrics.REBALANCER_CAPACITY_SLOTS.remove(model)
        for model, (demand, capacity) in measured.items():
            metrics.REBALANCER_DEMAND_SLOTS.labels(model).set(demand)
            metrics.REBALANCER_CAPACITY_SLOTS.labels(model).set(capacity)
        self._gauged = set(measured)

    def _forget(self) -> None:
        """This replica does not rebalance now: its gauges and its memory of moves are stale."""
        for model in self._gauged:
            metrics.REBALANCER_DEMAND_SLOTS.remove(model)
            metrics.REBALANCER_CAPACITY_SLOTS.remove(model)
        self._gauged = set()
        self.last_snapshot = None
        self.memory.pending.clear()
        self.memory.last_moved.clear()
