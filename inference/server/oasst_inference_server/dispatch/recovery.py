"""The recovery loop: the periodic repairs that keep the rules of docs/architecture.md true after a fault.

It runs on one replica at a time (a broker lock) every ``recovery_interval`` seconds and:

1. releases messages whose lease expired (their worker vanished without the server noticing, e.g.
   the replica holding its socket was killed), or that outlived their in-progress bound (a worker
   that answers pings but never finishes): they are retried elsewhere or fail;
2. re-queues pending messages that no work queue holds (Redis flushed or restarted, or a hint was
   lost in flight);
3. fails pending messages that waited ``no_worker_timeout`` with no worker connected for their
   model, so a reader gets an error naming the model instead of an endless pending;
4. fails pending messages that waited longer than their queue timeout (``queue_timeout``, or the
   shorter one the request asked for), with an error saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from datetime import datetime, timedelta, timezone

from loguru import logger
from sqlalchemy import or_
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server import metrics
from oasst_inference_server.broker import Broker
from oasst_inference_server.db.models import DbMessage, utcnow
from oasst_inference_server.dispatch import events, fair_share
from oasst_inference_server.dispatch.message_lifecycle import MessageLifecycle
from oasst_inference_server.dispatch.worker_registry import WorkerRegistry
from oasst_inference_server.settings import Settings
from oasst_shared.protocol import Cancel, dump_frame
from oasst_shared.schemas import MessageState

LOCK_NAME = "recovery-loop"


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
        await self.requeue_lost_work()
        await self.fail_unservable()
        await self.fail_overdue()

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

    async def _pending_longer_than(self, age: timedelta) -> list[DbMessage]:
        """The messages pending for longer than ``age``, oldest first."""
        cutoff = utcnow() - age
        async with self._sessions() as session:
            rows = await session.exec(
                select(DbMessage)
                .where(DbMessage.state == MessageState.pending, DbMessage.enqueued_at < cutoff)
                .order_by(DbMessage.enqueued_at)
            )
            return list(rows.all())

    async def requeue_lost_work(self) -> None:
        pending = await self._pending_longer_than(timedelta(seconds=self._settings.requeue_grace))
        by_model: dict[str, list[DbMessage]] = {}
        for message in pending:
            by_model.setdefault(message.model_config_name or "", []).append(message)
        for model, messages in by_model.items():
            queue = events.work_queue_name(model)
            queued = set(await self._broker.queued_ids(queue))
            missing = [m for m in messages if m.id not in queued]
            for message in missing:
                # Pushed with its stored ticket: the rebuilt queue keeps each user's share and order.
                await self._lifecycle.enqueue(message)
            if missing:
                logger.warning(
                    "re-queued {} pending messages of {} missing from the queue", len(missing), model
                )

    async def fail_unservable(self) -> None:
        waiting = await self._pending_longer_than(timedelta(seconds=self._settings.no_worker_timeout))
        if not waiting:
            return
        live = await self._registry.live_models()
        now = time.monotonic()
        self._absent_since = {m: t for m, t in self._absent_since.items() if m not in live}
        # Sessions are republished with every pong: a model must stay absent for a few ping intervals
        # (not just after a Redis restart emptied the session records) before its messages fail.
        settle = 3 * self._settings.worker_ping_interval
        for message in waiting:
            message_id, model = message.id, message.model_config_name
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

    async def fail_overdue(self) -> None:
        now = utcnow()
        # Requests may only shorten the timeout, and never below a second: older than that is a superset.
        waiting = await self._pending_longer_than(timedelta(seconds=min(1.0, self._settings.queue_timeout)))
        for message in waiting:
            ticket = fair_share.stored_ticket(message)
            timeout = ticket.timeout(self._settings) if ticket else self._settings.queue_timeout
            assert message.enqueued_at is not None
            if (now - _aware(message.enqueued_at)).total_seconds() <= timeout:
                continue
            failed = await self._lifecycle.fail(
                message.id,
                f"no worker took the message within its queue timeout of {timeout:g}s",
                state=MessageState.failed,
            )
            if failed and message.model_config_name:
                metrics.QUEUE_TIMEOUTS.labels(message.model_config_name).inc()
                await self._broker.remove_work(events.work_queue_name(message.model_config_name), message.id)


def _aware(moment: datetime) -> datetime:
    # SQLite hands back naive datetimes (stored as UTC).
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)
