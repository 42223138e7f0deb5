"""The recovery loop: the periodic repairs that keep the rules of docs/architecture.md true after a fault.

It runs on one replica at a time (a broker lock) every ``recovery_interval`` seconds and:

1. releases messages whose lease expired (their worker vanished without the server noticing, e.g.
   the replica holding its socket was killed), or that outlived their in-progress bound (a worker
   that answers pings but never finishes): they are retried elsewhere or fail;
2. re-queues pending messages that no work queue holds (Redis flushed or restarted, or a hint was
   lost in flight);
3. fails pending messages that waited ``no_worker_timeout`` with no worker connected for their
   model (none that serves it nor one that can load it), so a reader gets an error naming the model
   instead of an endless pending;
4. fails pending messages that waited longer than their queue timeout (``queue_timeout``, or the
   shorter one the request asked for), with an error saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from loguru import logger
from sqlalchemy import or_
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server import events, metrics
from oasst_inference_server.broker import Broker
from oasst_inference_server.db.models import DbMessage, utcnow
from oasst_inference_server.dispatch.message_lifecycle import MessageLifecycle
from oasst_inference_server.scheduling import fair_share
from oasst_inference_server.scheduling.worker_registry import WorkerRegistry
from oasst_inference_server.settings import Settings
from oasst_shared.protocol import Cancel, dump_frame
from oasst_shared.schemas import MessageState

LOCK_NAME = "recovery-loop"
# Requests may shorten their queue timeout (X-Queue-Timeout); the passes look at messages older than
# this (seconds), so one asking for less fails at the first pass after it.
_QUEUE_TIMEOUT_FLOOR = 1.0


class RecoveryLoop:
    def __init__(
        self,
        session_factory: async_sessionmaker[AsyncSession],
        broker: Broker,
        lifecycle: MessageLifecycle,
        registry: WorkerRegistry,
        settings: Settings,
    ):
        self._sessions = session_factory
        self._broker = broker
        self._lifecycle = lifecycle
        self._registry = registry
        self._settings = settings
        self.owner = f"replica-{uuid.uuid4().hex[:12]}"
        self.stopping = asyncio.Event()
        # When each model was first seen with no worker session (monotonic seconds).
        self._absent_since: dict[str, float] = {}

    async def run(self) -> None:
        interval = self._settings.recovery_interval
        while not self.stopping.is_set():
            try:
                if await self._broker.acquire_lock(LOCK_NAME, self.owner, ttl=interval * 3):
                    await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the loop must survive a broker or database outage
                logger.warning("recovery pass failed: {}: {}", type(exc).__name__, exc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), timeout=interval)

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self._broker.release_lock(LOCK_NAME, self.owner)

    async def tick(self) -> None:
        await self.expire_leases()
        # One read of the pending messages serves the three repairs that act on them.
        waiting = await self._pending_longer_than(self._shortest_wait_that_matters())
        await self.requeue_lost_work(waiting)
        await self.fail_unservable(waiting)
        await self.fail_overdue(waiting)

    async def expire_leases(self) -> None:
        now = utcnow()
        async with self._sessions() as session:
            expired = (
                await session.exec(
                    select(DbMessage.id, DbMessage.worker_session_id, DbMessage.lease_deadline).where(
                        DbMessage.state == MessageState.in_progress,
                        or_(DbMessage.lease_deadline < now, DbMessage.generation_deadline < now),
                    )
                )
            ).all()
        for message_id, session_id, lease_deadline in expired:
            if lease_deadline is not None and _aware(lease_deadline) < now:
                reason = "lease expired: the worker stopped responding"
            else:
                reason = (
                    "the generation outlived its in-progress bound (max_new_tokens / min_generation_rate)"
                )
            logger.warning("message {} (worker {}): {}", message_id, session_id, reason)
            if session_id:
                # If the worker still runs somewhere, it should stop: the message moves on.
                with contextlib.suppress(Exception):
                    await self._broker.publish_command(
                        events.worker_command_channel(session_id), dump_frame(Cancel(message_id=message_id))
                    )
            await self._lifecycle.release(message_id, session_id or "", reason)

    async def _pending_longer_than(self, age: timedelta) -> list[Waiting]:
        """The messages pending for longer than ``age``, oldest first: only the columns the repairs
        read (a pass must stay cheap with a long queue; whole rows carry prompts and payloads)."""
        cutoff = utcnow() - age
        async with self._sessions() as session:
            rows = await session.exec(
                select(DbMessage.id, DbMessage.model_config_name, DbMessage.enqueued_at, DbMessage.scheduling)
                .where(DbMessage.state == MessageState.pending, DbMessage.enqueued_at < cutoff)
                .order_by(DbMessage.enqueued_at)
            )
            return [
                Waiting(message_id, model, _aware(enqueued_at), scheduling)
                for message_id, model, enqueued_at, scheduling in rows.all()
            ]

    def _shortest_wait_that_matters(self) -> timedelta:
        """The youngest age any of the pending-message repairs acts on."""
        settings = self._settings
        return timedelta(
            seconds=min(settings.requeue_grace, settings.no_worker_timeout, _QUEUE_TIMEOUT_FLOOR)
        )

    async def _waiting(self, age: float, snapshot: list[Waiting] | None) -> list[Waiting]:
        if snapshot is None:
            return await self._pending_longer_than(timedelta(seconds=age))
        now = utcnow()
        return [w for w in snapshot if w.waited(now) > age]

    async def requeue_lost_work(self, snapshot: list[Waiting] | None = None) -> None:
        pending = await self._waiting(self._settings.requeue_grace, snapshot)
        by_model: dict[str, list[Waiting]] = {}
        for waiting in pending:
            by_model.setdefault(waiting.model or "", []).append(waiting)
        for model, in_model in by_model.items():
            queue = events.work_queue_name(model)
            queued = set(await self._broker.queued_ids(queue))
            requeued = 0
            for waiting in in_model:
                if waiting.id in queued:
                    continue
                message = await self._lifecycle.get(waiting.id)
                if message is None or message.state != MessageState.pending:
                    continue  # claimed, cancelled or failed since the snapshot
                # Pushed with its stored ticket: the rebuilt queue keeps each user's share and order.
                await self._lifecycle.enqueue(message)
                requeued += 1
            if requeued:
                logger.warning("re-queued {} pending messages of {} missing from the queue", requeued, model)

    async def fail_unservable(self, snapshot: list[Waiting] | None = None) -> None:
        waiting = await self._waiting(self._settings.no_worker_timeout, snapshot)
        if not waiting:
            return
        # A model a connected worker can load waits for the load (fleet.on_demand), within its queue timeout.
        if self._settings.on_demand_loading:
            live = await self._registry.fleet_models()
        else:
            live = await self._registry.live_models()
        now = time.monotonic()
        self._absent_since = {m: t for m, t in self._absent_since.items() if m not in live}
        # Sessions are republished with every pong: a model must stay absent for a few ping intervals
        # (not just after a Redis restart emptied the session records) before its messages fail.
        settle = 3 * self._settings.worker_ping_interval
        for message in waiting:
            message_id, model = message.id, message.model
            if model in live:
                continue
            if now - self._absent_since.setdefault(model or "", now) < settle:
                continue
            await self._lifecycle.fail(
                message_id,
                f"no worker for model {model!r} connected within {self._settings.no_worker_timeout:.0f}s",
                state=MessageState.failed,
            )
            if model:
                await self._broker.remove_work(events.work_queue_name(model), message_id)

    async def fail_overdue(self, snapshot: list[Waiting] | None = None) -> None:
        waiting = await self._waiting(min(_QUEUE_TIMEOUT_FLOOR, self._settings.queue_timeout), snapshot)
        now = utcnow()
        for message in waiting:
            ticket = fair_share.ticket_from(message.scheduling)
            timeout = ticket.timeout(self._settings) if ticket else self._settings.queue_timeout
            if message.waited(now) <= timeout:
                continue
            failed = await self._lifecycle.fail(
                message.id,
                f"no worker took the message within its queue timeout of {timeout:g}s",
                state=MessageState.failed,
            )
            if failed and message.model:
                metrics.QUEUE_TIMEOUTS.labels(message.model).inc()
                await self._broker.remove_work(events.work_queue_name(message.model), message.id)


@dataclass(frozen=True)
class Waiting:
    """What the repairs read of a pending message."""

    id: str
    model: str | None
    enqueued_at: datetime
    scheduling: dict[str, Any] | None

    def waited(self, now: datetime) -> float:
        return (now - self.enqueued_at).total_seconds()


def _aware(moment: datetime) -> datetime:
    # SQLite hands back naive datetimes (stored as UTC).
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)
