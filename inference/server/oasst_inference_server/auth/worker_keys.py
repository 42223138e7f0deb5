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
from oasst_inference_server.db.models import DbWorker, DbWorkerEvent

WORKER_KEY_PREFIX = "owk_"


def new_worker_key() -> tuple[str, str, str]:
    """(key, its hash, the prefix shown in listings)."""
    key = WORKER_KEY_PREFIX + secrets.token_urlsafe(32)
    return key, hash_secret(key), key[: len(WORKER_KEY_PREFIX) + 6]


async def find_worker_by_key(sessions: async_sessionmaker[AsyncSession], key: str | None) -> DbWorker | None:
    if not key or not key.startswith(WORKER_KEY_PREFIX):
        return None
    try:
        async with sessions() as session:
            return (
                await session.exec(select(DbWorker).where(DbWorker.api_key_hash == hash_secret(key)))
            ).one_or_none()
    except Exception as exc:  # the database is down: refuse rather than fail the handshake
        logger.error("could not check a worker key: {}", exc)
        return None


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
