"""One dispatcher per model on each replica: takes the model's next job while any of this replica's
workers for it has room, and hands it to the worker that will start and finish it soonest.

The broker's fair queue decides *which* job comes next (the waiting user with the least service);
:func:`.capacity.choose_worker` decides *where* it goes. The dispatcher only *reserves* a slot on
the chosen connection and passes it the message id; the connection claims the message (the atomic
database update) and sends it, exactly as before. A job that fits no worker's free KV cache goes back
to the queue and the dispatcher waits for capacity to change.

Several replicas each run a dispatcher per model: they pop the shared queue in turn, each for its own
workers, so a job goes to the best worker of the replica that popped it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Protocol

from loguru import logger

from oasst_inference_server import events, metrics
from oasst_inference_server.broker import Broker, BrokerError
from oasst_inference_server.db.models import DbMessage
from oasst_inference_server.scheduling import fair_share
from oasst_inference_server.scheduling.capacity import WorkerCapacity, choose_worker
from oasst_shared.schemas import MessageState


class Assignable(Protocol):
    """What the dispatcher needs of a worker connection (``worker_connection.WorkerConnection``)."""

    session_id: str
    capacity: WorkerCapacity

    def assign(self, message_id: str, max_new_tokens: int | None = None) -> None: ...

    def reserve(self) -> None: ...


class Requeuing(Protocol):
    """What the dispatcher needs of the message lifecycle (``message_lifecycle.MessageLifecycle``)."""

    async def get(self, message_id: str) -> DbMessage | None: ...

    async def requeue(self, message_id: str) -> None: ...


# How long a job that fit no worker's KV cache keeps the dispatcher waiting before it looks again.
_NO_FIT_BACKOFF = 1.0


class ModelDispatcher:
    def __init__(
        self, model: str, broker: Broker, lifecycle: Requeuing, *, trusted_only_tiers: bool = False
    ) -> None:
        self.model = model
        # Whether some user tier needs trusted workers (settings.trusted_workers_only_tiers): only then
        # is a job's ticket read to place it away from untrusted workers.
        self._trusted_only_tiers = trusted_only_tiers
        self.queue = events.work_queue_name(model)
        self._broker = broker
        self._lifecycle = lifecycle
        self.workers: dict[str, Assignable] = {}
        # Counts the workers' arrivals and departures: what is built from the list of workers (their
        # capacities here, the counting workers of ``workers.prompt_sizes``) is rebuilt when it moves,
        # not per job or per request. (A connection's capacity object is replaced only while it is
        # detached: a model switch.)
        self.version = 0
        self._capacity_list: list[WorkerCapacity] | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # True while the dispatcher waits on the queue with room on some worker and nothing in hand: a
        # new job may then go to a worker at once (:meth:`take_now`).
        self.waiting = False
        # Workers cap prompt plus answer at the model's max_total_length: no job needs more KV cache.
        self.max_total_length: int | None = None

    def attach(self, connection: Assignable) -> None:
        self.workers[connection.session_id] = connection
        self.workers_changed()
        info: Any = getattr(connection, "info", None)
        if info is not None:
            self.max_total_length = info.model_config_.max_total_length
        self.capacity_changed()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"dispatch {self.model}")

    async def detach(self, connection: Assignable) -> None:
        self.workers.pop(connection.session_id, None)
        self.workers_changed()
        self.capacity_changed()
        if not self.workers and self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(task), 2.0)

    def capacity_changed(self) -> None:
        self._changed.set()

    def workers_changed(self) -> None:
        """A worker arrived, left, or announced its model anew: lists built from the workers are stale."""
        self.version += 1
        self._capacity_list = None

    def _capacities(self) -> list[WorkerCapacity]:
        """The workers' capacities (live objects: their counts are current), listed once per change of
        the workers: with a thousand workers, listing them per job cost more than choosing among them."""
        if self._capacity_list is None:
            self._capacity_list = [connection.capacity for connection in self.workers.values()]
        return self._capacity_list

    async def _wait_for_change(self, timeout: float | None = None) -> None:
        self._changed.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    async def _run(self) -> None:
        while self.workers:
            if not any(c.free_slots > 0 and c.takes_user_work for c in self._capacities()):
                await self._wait_for_change()
                continue
            self.waiting = True
            try:
                popped = await self._broker.pop_hint(self.queue, timeout=1.0)
            except BrokerError as exc:
                # Redis is down or restarting: try again; the recovery loop re-queues what it lost.
                logger.warning("dispatcher of {}: cannot read the work queue: {}", self.model, exc)
                await asyncio.sleep(1.0)
                continue
            finally:
                self.waiting = False
            if popped is None:
                continue
            message_id = popped.message_id
            try:
                await self._place(message_id, fair_share.Placement.parse(popped.job))
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await self._lifecycle.requeue(message_id)
                raise
            except Exception as exc:  # a database hiccup must not stop this model's dispatching
                logger.opt(exception=exc).error("dispatcher of {}: placing {} failed", self.model, message_id)
                with contextlib.suppress(Exception):
                    await self._lifecycle.requeue(message_id)
                await asyncio.sleep(0.5)

    def take_now(self, placement: fair_share.Placement) -> Assignable | None:
        """The worker a new job of ``placement`` goes to at once, its slot reserved, if this dispatcher
        is waiting on its queue (nothing popped is being placed) and a worker can take the job; else
        None (the job is queued). The caller must still check that nothing waits in the queue."""
        if not self.waiting:
            return None
        tokens = placement.tokens
        if self.max_total_length is not None:
            tokens = min(tokens, self.max_total_length)
        chosen = choose_worker(
            self._capacities(),
            tokens,
            trusted_only=placement.trusted_only,
            affinity=placement.affinity,
            cached_tokens=placement.cached_tokens,
        )
        if chosen is None:
            return None
        _count_affinity(self.model, placement, chosen)
        connection = self.workers[chosen.session_id]
        connection.reserve()
        return connection

    async def _place(self, message_id: str, placement: fair_share.Placement | None) -> None:
        """``placement``: what the hint carried (None for a hint pushed without it)."""
        capacities = self._capacities()
        # Only the KV-cache check needs the job's size (the ranking by speed does not), and the user's
        # tier matters only where some tier needs trusted workers and an untrusted one could take it:
        # only then is a hint without its placement worth a read of the message.
        if placement is None and any(
            c.kv_cache_free_tokens is not None
            or (self._trusted_only_tiers and c.takes_user_work and not c.trusted)
            for c in capacities
        ):
            message = await self._lifecycle.get(message_id)
            if message is None or message.state != MessageState.pending:
                return  # stale hint
            ticket = fair_share.stored_ticket(message)
            placement = ticket.placement() if ticket else None
        tokens = placement.tokens if placement else 0
        if self.max_total_length is not None:
            tokens = min(tokens, self.max_total_length)
        trusted_only = placement.trusted_only if placement else False
        chosen = choose_worker(
            capacities,
            tokens,
            trusted_only=trusted_only,
            affinity=placement.affinity if placement else None,
            cached_tokens=placement.cached_tokens if placement else 0,
        )
        if chosen is None:
            # No room after all (a worker left or filled), or too long for every free KV cache: the job
            # goes back, keeping its user's place, and waits for a worker that can take it.
            await self._lifecycle.requeue(message_id)
            await self._wait_for_change(_NO_FIT_BACKOFF)
            return
        if placement is not None:
            _count_affinity(self.model, placement, chosen)
        self.workers[chosen.session_id].assign(message_id, placement.max_new_tokens if placement else None)


def _count_affinity(model: str, placement: fair_share.Placement, chosen: WorkerCapacity) -> None:
    """The hit rate of affinity: a follow-up that went to the worker of its previous turn, or not."""
    if placement.affinity:
        outcome = "hit" if chosen.session_id == placement.affinity else "miss"
        metrics.AFFINITY_DISPATCHES.labels(model, outcome).inc()


class Dispatchers:
    """This replica's dispatchers, one per model, created on its first worker connection."""

    def __init__(self, broker: Broker, lifecycle: Requeuing, *, trusted_only_tiers: bool = False) -> None:
        self._broker = broker
        self._lifecycle = lifecycle
        self._trusted_only_tiers = trusted_only_tiers
        self.by_model: dict[str, ModelDispatcher] = {}

    def for_model(self, model: str) -> ModelDispatcher:
        dispatcher = self.by_model.get(model)
        if dispatcher is None:
            dispatcher = self.by_model[model] = ModelDispatcher(
                model, self._broker, self._lifecycle, trusted_only_tiers=self._trusted_only_tiers
            )
        return dispatcher
