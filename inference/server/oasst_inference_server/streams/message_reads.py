"""What a message's event readers ask besides its stream: the message, its state (batched), its place in
the queue, and its terminal event rebuilt from the database.

Readers only read: nothing here changes a message (that is :mod:`..dispatch.message_lifecycle`'s), so a
reader's path goes from the stream to the database and the broker and never back into the state machine.
"""

from __future__ import annotations

from sqlalchemy import case, func
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server import events
from oasst_inference_server.broker import Broker, BrokerError
from oasst_inference_server.broker.session_view import WorkerSessionView
from oasst_inference_server.db.models import DbMessage
from oasst_inference_server.scheduling import fair_share
from oasst_inference_server.scheduling.capacity import DEFAULT_TOKENS_PER_SECOND
from oasst_inference_server.streams.state_checks import StateChecks
from oasst_shared.schemas import MessageState


class MessageReads:
    def __init__(
        self,
        session_factory: async_sessionmaker[AsyncSession],
        broker: Broker,
        worker_sessions: WorkerSessionView | None = None,
        state_check_sessions: async_sessionmaker[AsyncSession] | None = None,
    ):
        self._sessions = session_factory
        self._broker = broker
        # The process's view of the worker sessions (shared with the registry where main builds both).
        self._worker_sessions = worker_sessions or WorkerSessionView(broker)
        # Silent streams' readers ask for their message's state through it, batched, on connections of
        # its own where main gives it some: 10,000 held streams then take none of the request pool's.
        self.state_checks = StateChecks(state_check_sessions or session_factory)

    async def close(self) -> None:
        await self.state_checks.close()

    async def get(self, message_id: str) -> DbMessage | None:
        async with self._sessions() as session:
            return await session.get(DbMessage, message_id)

    def final_event(self, message: DbMessage) -> str:
        """The terminal event of a finished message, rebuilt from the database."""
        if message.state in (MessageState.complete, MessageState.cancelled):
            return events.message_event(events.to_message_read(message))
        return events.error_event(
            message.error or f"message {message.state}", events.to_message_read(message)
        )

    async def queue_position(self, message: DbMessage) -> tuple[int, int, float | None]:
        """(1-based position, queue size, estimated wait in seconds or None) of a pending message.

        The position is the message's place in the order the fair queue will dispatch (every replica
        computes the same); if the broker does not hold it (Redis restarted, not re-queued yet), it
        falls back to the database's order of arrival.
        """
        assert message.model_config_name is not None
        queue = events.work_queue_name(message.model_config_name)
        try:
            order = await self._broker.queued_ids(queue)
        except BrokerError:
            order = []
        if message.id in order:
            position, size = order.index(message.id) + 1, len(order)
        else:
            position, size = await self._arrival_position(message)
        return position, size, await self._estimated_wait(message, position)

    async def model_loading(self, message: DbMessage) -> bool:
        """True while no worker has the message's model loaded and some worker is loading it or can load
        it (protocol 6): the message waits for a load (``fleet.on_demand``) more than for a slot."""
        model = message.model_config_name
        try:
            sessions = await self._worker_sessions.sessions()
        except BrokerError:
            return False
        if model is None or any(w.loaded and w.model_config_.name == model for w in sessions):
            return False
        return any(
            (w.switch is not None and w.switch.model_config_name == model) or w.can_load(model)
            for w in sessions
        )

    async def _arrival_position(self, message: DbMessage) -> tuple[int, int]:
        pending = (DbMessage.state == MessageState.pending) & (
            DbMessage.model_config_name == message.model_config_name
        )
        ahead = case((DbMessage.enqueued_at < message.enqueued_at, 1))
        async with self._sessions() as session:
            # One query for both numbers: every pending reader asks once per update interval.
            size, ahead_count = (
                await session.exec(select(func.count(), func.count(ahead)).where(pending))
            ).one()
        return int(ahead_count) + 1, int(size)

    async def _estimated_wait(self, message: DbMessage, position: int) -> float | None:
        """Seconds until a slot frees for the message: the jobs ahead of it that do not fit the free
        slots, each as long as this one, at the measured throughput of the model's workers."""
        try:
            sessions = await self._worker_sessions.sessions()
        except BrokerError:
            return None
        workers = [w for w in sessions if w.loaded and w.model_config_.name == message.model_config_name]
        if not workers:
            return None
        free = sum(w.free_slots for w in workers)
        if position <= free:
            return 0.0
        throughput = sum(
            (w.max_parallel_requests or 1) * (w.tokens_per_second or DEFAULT_TOKENS_PER_SECOND)
            for w in workers
        )
        ticket = fair_share.stored_ticket(message)
        tokens = ticket.prompt_tokens + ticket.max_new_tokens if ticket else 256
        return round((position - free) * tokens / max(throughput, 1e-6), 1)
