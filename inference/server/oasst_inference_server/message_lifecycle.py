"""The life of an assistant message: enqueue, claim, stream, finish, retry or fail.

Every state change is one conditional database update, so two workers (or two replicas) can never
both own a message (DESIGN invariant 2), and a stale worker's late result is ignored. After the
database changes, the matching event goes to the message's broker stream; the terminal event is
appended only after the database says the message is finished, so a reader that sees it can read the
finished message back.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from loguru import logger
from sqlalchemy import case, func, select, update
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server import events, metrics
from oasst_inference_server.broker import Broker, BrokerError
from oasst_inference_server.models import DbMessage, utcnow
from oasst_inference_server.settings import Settings
from oasst_shared.protocol import Cancel, ChatTurn, Embeddings, EmbedWork, GeneratedText, Work, dump_frame
from oasst_shared.sampling import SamplingParameters
from oasst_shared.schemas import MessageRead, MessageState, Role

_ACTIVE = (MessageState.pending.value, MessageState.in_progress.value)


def to_message_read(message: DbMessage) -> MessageRead:
    return MessageRead(
        id=message.id,
        chat_id=message.chat_id,
        parent_id=message.parent_id,
        content=message.content,
        created_at=message.created_at,
        role=Role(message.role),
        state=MessageState(message.state),
        score=message.score,
        model_config_name=message.model_config_name,
        sampling_parameters=(
            SamplingParameters.model_validate(message.sampling_parameters)
            if message.sampling_parameters is not None
            else None
        ),
        error=message.error,
        finish_reason=message.finish_reason,
        generated_tokens=message.generated_tokens,
        prompt_tokens=message.prompt_tokens,
        attempts=message.attempts,
    )


class MessageLifecycle:
    def __init__(self, session_factory: async_sessionmaker[AsyncSession], broker: Broker, settings: Settings):
        self._sessions = session_factory
        self._broker = broker
        self._settings = settings

    # ------------------------------------------------------------ reads
    async def get(self, message_id: str) -> DbMessage | None:
        async with self._sessions() as session:
            return await session.get(DbMessage, message_id)

    async def queue_position(self, message: DbMessage) -> tuple[int, int]:
        """(1-based position, queue size) among pending messages of the same model, from the database."""
        pending = (DbMessage.state == MessageState.pending.value) & (
            DbMessage.model_config_name == message.model_config_name
        )
        ahead = case((DbMessage.enqueued_at < message.enqueued_at, 1))
        async with self._sessions() as session:
            # One query for both numbers: every pending reader asks once per update interval.
            size, ahead_count = (
                await session.execute(select(func.count(), func.count(ahead)).where(pending))
            ).one()
        return int(ahead_count) + 1, int(size)

    # ------------------------------------------------------------ enqueue and claim
    async def enqueue(self, message: DbMessage) -> None:
        """Announce a message already committed as pending to the workers of its model."""
        assert message.model_config_name is not None
        await self._broker.push_work(events.work_queue_name(message.model_config_name), message.id)

    async def claim(self, message_id: str, session_id: str) -> Work | EmbedWork | None:
        """Atomically take a pending message for a worker session; None if someone else has it.

        One transaction: the conditional UPDATE returns the claimed row (RETURNING, on Postgres and
        SQLite alike), the conversation is read in the same transaction, then it commits.
        """
        now = utcnow()
        async with self._sessions() as session:
            claimed = (
                await session.execute(
                    update(DbMessage)
                    .where(DbMessage.id == message_id, DbMessage.state == MessageState.pending.value)
                    .values(
                        state=MessageState.in_progress.value,
                        worker_session_id=session_id,
                        lease_deadline=now + timedelta(seconds=self._settings.lease_seconds),
                        started_at=now,
                        attempts=DbMessage.attempts + 1,
                    )
                    .returning(DbMessage)
                )
            ).scalar_one_or_none()
            if claimed is None:
                await session.rollback()
                return None
            work = await self._work_frame(session, claimed)
            await session.commit()
            return work

    async def _work_frame(self, session: AsyncSession, message: DbMessage) -> Work | EmbedWork:
        payload = message.request_payload or {}
        if message.kind == "embedding":
            return EmbedWork(
                message_id=message.id,
                model_config_name=message.model_config_name or "",
                inputs=list(payload.get("inputs", [])),
                attempt=message.attempts,
            )
        if message.chat_id is not None and message.kind == "chat":
            thread = await self._thread(session, message)
        else:
            thread = [ChatTurn.model_validate(t) for t in payload.get("thread", [])]
        raw_prompt = payload.get("raw_prompt")
        if not thread:
            thread = [ChatTurn(role="user", content=raw_prompt or "")]
        return Work(
            message_id=message.id,
            chat_id=message.chat_id,
            model_config_name=message.model_config_name or "",
            thread=thread,
            system_prompt=message.system_prompt,
            sampling_parameters=SamplingParameters.model_validate(message.sampling_parameters or {}),
            raw_prompt=raw_prompt,
            attempt=message.attempts,
        )

    async def _thread(self, session: AsyncSession, message: DbMessage) -> list[ChatTurn]:
        """The conversation from the root to the message's parent, oldest first."""
        rows = (
            await session.execute(
                select(DbMessage.id, DbMessage.parent_id, DbMessage.role, DbMessage.content).where(
                    DbMessage.chat_id == message.chat_id
                )
            )
        ).all()
        by_id = {r.id: r for r in rows}
        turns: list[ChatTurn] = []
        current = by_id.get(message.parent_id) if message.parent_id else None
        while current is not None:
            role = "user" if current.role == Role.prompter.value else "assistant"
            turns.append(ChatTurn(role=role, content=current.content or ""))
            current = by_id.get(current.parent_id) if current.parent_id else None
        turns.reverse()
        return turns

    async def extend_leases(self, session_id: str) -> None:
        async with self._sessions() as session:
            await session.execute(
                update(DbMessage)
                .where(
                    DbMessage.worker_session_id == session_id,
                    DbMessage.state == MessageState.in_progress.value,
                )
                .values(lease_deadline=utcnow() + timedelta(seconds=self._settings.lease_seconds))
            )
            await session.commit()

    # ------------------------------------------------------------ streaming and results
    async def _append_terminal(self, message_id: str, data: str) -> None:
        """Append a terminal event; if the broker is down, readers fall back to the database."""
        try:
            await self._broker.append_event(events.stream_name(message_id), data, terminal=True)
        except BrokerError as exc:
            logger.warning("terminal event of {} not stored in the broker: {}", message_id, exc)

    async def complete(self, session_id: str, result: GeneratedText) -> bool:
        """Store the finished text; False if this session no longer owns the message."""
        cancelled = result.finish_reason == "cancelled"
        message = await self._finish(
            result.message_id,
            session_id,
            state=MessageState.cancelled if cancelled else MessageState.complete,
            content=result.text,
            finish_reason=result.finish_reason,
            generated_tokens=result.generated_tokens,
            prompt_tokens=result.prompt_tokens,
        )
        if message is None:
            logger.warning("ignored a result for message {} from session {}", result.message_id, session_id)
            return False
        await self._append_terminal(message.id, events.message_event(to_message_read(message)))
        logger.info(
            "message {} complete: {} tokens, {}", message.id, result.generated_tokens, result.finish_reason
        )
        return True

    async def complete_embeddings(self, session_id: str, result: Embeddings) -> bool:
        """Store the vectors of an embedding request; False if this session no longer owns it."""
        message = await self._finish(
            result.message_id,
            session_id,
            state=MessageState.complete,
            result_payload={"embeddings": result.embeddings},
            prompt_tokens=result.prompt_tokens,
            generated_tokens=0,
        )
        if message is None:
            return False
        await self._append_terminal(message.id, events.message_event(to_message_read(message)))
        return True

    async def release(self, message_id: str, session_id: str, reason: str, *, retryable: bool = True) -> None:
        """The owning session lost or failed the message: retry it elsewhere, or fail it for good."""
        async with self._sessions() as session:
            message = await session.get(DbMessage, message_id)
            if (
                message is None
                or message.state != MessageState.in_progress.value
                or message.worker_session_id != session_id
            ):
                return
            attempts = message.attempts
            cancel_requested = message.cancel_requested
        if cancel_requested:
            await self._finish_cancelled(message_id, session_id)
            return
        if retryable and attempts < self._settings.max_attempts:
            async with self._sessions() as session:
                result = await session.execute(
                    update(DbMessage)
                    .where(
                        DbMessage.id == message_id,
                        DbMessage.state == MessageState.in_progress.value,
                        DbMessage.worker_session_id == session_id,
                    )
                    .values(state=MessageState.pending.value, worker_session_id=None, lease_deadline=None)
                )
                await session.commit()
                if result.rowcount != 1:  # type: ignore[attr-defined]
                    return
                message = await session.get(DbMessage, message_id)
            assert message is not None
            try:
                await self._broker.append_event(
                    events.stream_name(message_id), events.retry_event(attempts + 1, reason)
                )
                await self.enqueue(message)
            except BrokerError as exc:
                logger.warning(
                    "retry of {} not announced (the recovery loop re-queues it): {}", message_id, exc
                )
            logger.warning("message {} will be retried (attempt {}): {}", message_id, attempts + 1, reason)
            metrics.RETRIES.labels(message.model_config_name or "").inc()
            return
        error = reason if not retryable else f"gave up after {attempts} attempts: {reason}"
        await self.fail(message_id, error, state=MessageState.aborted_by_worker, session_id=session_id)

    async def request_cancel(self, message: DbMessage) -> None:
        """Cancel a pending message now, or ask the worker generating it to stop."""
        metrics.CANCELS.inc()
        if message.state == MessageState.pending.value:
            if await self._finish_cancelled(message.id, None) and message.model_config_name:
                await self._broker.remove_work(events.work_queue_name(message.model_config_name), message.id)
            return
        if message.state != MessageState.in_progress.value:
            return
        async with self._sessions() as session:
            await session.execute(
                update(DbMessage)
                .where(DbMessage.id == message.id, DbMessage.state == MessageState.in_progress.value)
                .values(cancel_requested=True)
            )
            await session.commit()
        current = await self.get(message.id)
        if current is None or current.state != MessageState.in_progress.value:
            # Finished or released meanwhile; a release sees cancel_requested and cancels.
            if current is not None and current.state == MessageState.pending.value:
                await self.request_cancel(current)
            return
        assert current.worker_session_id is not None
        await self._broker.publish_command(
            events.worker_command_channel(current.worker_session_id),
            dump_frame(Cancel(message_id=message.id)),
        )
        logger.info("cancel of message {} sent to worker {}", message.id, current.worker_session_id)

    async def _finish_cancelled(self, message_id: str, session_id: str | None) -> bool:
        message = await self._finish(message_id, session_id, state=MessageState.cancelled)
        if message is None:
            return False
        await self._append_terminal(message.id, events.message_event(to_message_read(message)))
        logger.info("message {} cancelled", message_id)
        return True

    def final_event(self, message: DbMessage) -> str:
        """The terminal event of a finished message, rebuilt from the database."""
        if message.state in (MessageState.complete.value, MessageState.cancelled.value):
            return events.message_event(to_message_read(message))
        return events.error_event(message.error or f"message {message.state}", to_message_read(message))

    async def fail(
        self,
        message_id: str,
        error: str,
        *,
        state: MessageState = MessageState.failed,
        session_id: str | None = None,
    ) -> bool:
        message = await self._finish(message_id, session_id, state=state, error=error)
        if message is None:
            return False
        await self._append_terminal(message.id, events.error_event(error, to_message_read(message)))
        logger.warning("message {} ended {}: {}", message_id, state.value, error)
        return True

    async def _finish(
        self, message_id: str, session_id: str | None, *, state: MessageState, **values: object
    ) -> DbMessage | None:
        message = await self._finish_in_db(message_id, session_id, state=state, **values)
        if message is not None:
            metrics.COMPLETED.labels(message.model_config_name or "", state.value).inc()
        return message

    async def _finish_in_db(
        self, message_id: str, session_id: str | None, *, state: MessageState, **values: object
    ) -> DbMessage | None:
        conditions = [DbMessage.id == message_id, DbMessage.state.in_(_ACTIVE)]
        if session_id is not None:
            conditions.append(DbMessage.worker_session_id == session_id)
        async with self._sessions() as session:
            result = await session.execute(
                update(DbMessage)
                .where(*conditions)
                .values(state=state.value, finished_at=utcnow(), lease_deadline=None, **values)
            )
            if result.rowcount != 1:  # type: ignore[attr-defined]
                await session.rollback()
                return None
            await session.commit()
            return await session.get(DbMessage, message_id)


def lease_expired(message: DbMessage, now: datetime | None = None) -> bool:
    return message.lease_deadline is not None and message.lease_deadline < (now or utcnow())
