"""API keys of workers registered through the admin API, and the audit trail of their sockets.

Keys are random, shown once, and stored as SHA-256 hashes. Workers may also use the static keys of
``settings.worker_api_keys`` (the embedded default and simple deployments).
"""

from __future__ import annotations

import secrets
from typing import Any

from loguru import logger
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.auth.refresh_tokens import hash_secret
from oasst_inference_server.broker import Broker, WorkerSession
from oasst_inference_server.db.models import DbWorker, DbWorkerEvent
from oasst_inference_server.settings import Settings
from oasst_shared.protocol import WorkerInfo

WORKER_KEY_PREFIX = "owk_"


def new_worker_key() -> tuple[str, str, str]:
    """(key, its hash, the prefix shown in listings)."""
    key = WORKER_KEY_PREFIX + secrets.token_urlsafe(32)
    return key, hash_secret(key), key[: len(WORKER_KEY_PREFIX) + 6]


class KeyCheckUnavailable(Exception):
    """The database cannot be asked right now: the worker should come back later, not give up."""


async def find_worker_by_key(sessions: async_sessionmaker[AsyncSession], key: str | None) -> DbWorker | None:
    """The registered worker of ``key``; None for an unknown key. Raises :class:`KeyCheckUnavailable`
    while the database is unreachable (a refusal would make the worker give up for good)."""
    if not key or not key.startswith(WORKER_KEY_PREFIX):
        return None
    try:
        async with sessions() as session:
            return (
                await session.exec(select(DbWorker).where(DbWorker.api_key_hash == hash_secret(key)))
            ).one_or_none()
    except Exception as exc:
        logger.error("could not check a worker key: {}: {}", type(exc).__name__, exc)
        raise KeyCheckUnavailable(str(exc)) from None


async def key_refusal(
    info: WorkerInfo, worker: DbWorker | None, settings: Settings, broker: Broker
) -> str | None:
    """Why the key does not allow what the worker announced (sent as the close reason), or None.

    Every key: at most ``settings.max_slots_per_worker`` slots. A registered worker's key may allow
    fewer slots, only some model configs, and a number of sockets at once (counted on every replica
    through the broker's session records)."""
    slots = settings.max_slots_per_worker
    if worker is not None and worker.max_slots is not None:
        slots = min(slots, worker.max_slots)
    if info.max_parallel_requests > slots:
        return f"the worker announces {info.max_parallel_requests} slots; its key allows at most {slots}"
    if worker is None:
        return None
    model = info.model_config_.name
    if worker.allowed_models is not None and model not in worker.allowed_models:
        return f"the key does not allow model config {model!r} (allowed: {', '.join(worker.allowed_models) or 'none'})"
    if worker.max_sockets is not None:
        open_sockets = await count_sockets(broker, worker.id)
        if open_sockets >= worker.max_sockets:
            return f"the key allows {worker.max_sockets} sockets at once and {open_sockets} are open"
    return None


async def count_sockets(broker: Broker, worker_id: str) -> int:
    return len(await live_sessions_of(broker, worker_id))


async def live_sessions_of(broker: Broker, worker_id: str) -> list[str]:
    """The session ids of the worker's open sockets, on every replica."""
    sessions = []
    for record in await broker.list_worker_sessions():
        session = WorkerSession.of(record)
        if session is not None and session.worker_id == worker_id:
            sessions.append(record.session_id)
    return sessions


async def record_worker_event(
    sessions: async_sessionmaker[AsyncSession],
    *,
    worker_id: str | None,
    session_id: str,
    event_type: str,
    model_config_name: str | None = None,
    details: dict[str, Any] | None = None,
) -> None:
    """Best effort: a database hiccup must not cost a worker its connection."""
    try:
        async with sessions() as session:
            session.add(
                DbWorkerEvent(
                    worker_id=worker_id,
                    session_id=session_id,
                    event_type=event_type,
                    model_config_name=model_config_name,
                    details=details,
                )
            )
            await session.commit()
    except Exception as exc:
        logger.warning("could not record worker event {} of {}: {}", event_type, session_id, exc)
