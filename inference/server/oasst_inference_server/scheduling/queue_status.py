"""What operators see of the queues (``GET /admin/queues`` and the Prometheus gauges).

Depth and oldest wait come from the database (the truth); each user's backlog and counter from the
broker's fair queue; each worker's load from the live worker sessions; the service given per user from
the token counts of the messages that finished within the window.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server import events
from oasst_inference_server.broker import Broker, BrokerError, WorkerSession
from oasst_inference_server.db.models import DbChat, DbMessage, utcnow
from oasst_shared.schemas import (
    MessageState,
    ModelQueueStatus,
    QueueStatus,
    UserBacklog,
    UserService,
    WorkerLoad,
)

SERVICE_WINDOW_SECONDS = 300.0
TOP_USERS = 20


async def queue_status(
    session_factory: async_sessionmaker[AsyncSession], broker: Broker, window: float = SERVICE_WINDOW_SECONDS
) -> QueueStatus:
    now = utcnow()
    since = now - timedelta(seconds=window)
    user = func.coalesce(DbMessage.user_id, DbChat.user_id)
    async with session_factory() as session:
        pending = (
            await session.exec(
                select(DbMessage.model_config_name, func.count(), func.min(DbMessage.enqueued_at))
                .where(DbMessage.state == MessageState.pending)
                .group_by(DbMessage.model_config_name)
            )
        ).all()
        tokens = func.sum(
            func.coalesce(DbMessage.prompt_tokens, 0) + func.coalesce(DbMessage.generated_tokens, 0)
        )
        served = (
            await session.exec(
                select(DbMessage.model_config_name, user, tokens)
                .outerjoin(DbChat, DbChat.id == DbMessage.chat_id)
                .where(DbMessage.finished_at >= since, DbMessage.model_config_name.is_not(None))
                .group_by(DbMessage.model_config_name, user)
                .order_by(tokens.desc())
            )
        ).all()
    models: dict[str, ModelQueueStatus] = {}

    def model(name: str) -> ModelQueueStatus:
        return models.setdefault(name, ModelQueueStatus(model_config_name=name, depth=0))

    for name, count, oldest in pending:
        status = model(name or "")
        status.depth = int(count)
        if oldest is not None:
            status.oldest_wait_seconds = max(0.0, (now - oldest).total_seconds())
    for name, user_id, total in served:
        status = model(name)
        if len(status.service) < TOP_USERS and total:
            status.service.append(UserService(user_id=user_id or "", tokens=int(total)))
    try:
        sessions = await broker.list_worker_sessions()
    except BrokerError:
        sessions = []
    for record in sessions:
        load = WorkerLoad(session_id=record.session_id)
        worker = WorkerSession.of(record)
        if worker is not None and not worker.loaded:
            continue  # its backend holds no model (protocol 6): it serves none (GET /admin/fleet lists it)
        if worker is not None:
            load = WorkerLoad(
                session_id=record.session_id,
                max_parallel_requests=worker.max_parallel_requests,
                in_flight=len(worker.in_flight),
                free_slots=worker.free_slots,
                kv_cache_free_tokens=worker.kv_cache_free_tokens,
                backend_queue_length=worker.backend_queue_length,
                tokens_per_second=worker.tokens_per_second,
            )
        model(record.model_config_name).workers.append(load)
    for status in models.values():
        try:
            snapshot = await broker.queue_snapshot(events.work_queue_name(status.model_config_name))
        except BrokerError:
            continue
        status.backlog = sorted(
            (
                UserBacklog(user_id=user_id, waiting=len(snapshot.waiting.get(user_id, [])), counter=counter)
                for user_id, counter in snapshot.counters.items()
            ),
            key=lambda b: -b.waiting,
        )[:TOP_USERS]
    return QueueStatus(
        window_seconds=window, models=sorted(models.values(), key=lambda m: m.model_config_name)
    )
