"""Registered workers as the admin API manages them: create, list, replace the key, change limits and
trust, delete; and which registered worker each live socket belongs to."""

from __future__ import annotations

from sqlalchemy import delete
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.auth.worker_keys import new_worker_key
from oasst_inference_server.db.models import DbWorker, DbWorkerEvent, utcnow
from oasst_inference_server.domain_errors import not_found


async def session_workers(session: AsyncSession, session_ids: list[str]) -> dict[str, str | None]:
    """The registered worker each socket session connected as (None for a static key)."""
    if not session_ids:
        return {}
    rows = await session.exec(
        select(DbWorkerEvent.session_id, DbWorkerEvent.worker_id).where(
            DbWorkerEvent.session_id.in_(session_ids),
            DbWorkerEvent.event_type == "connected",
        )
    )
    return dict(rows.all())


async def worker_names(session: AsyncSession, worker_ids: set[str]) -> dict[str, str]:
    """The names of the given workers (those that still exist)."""
    if not worker_ids:
        return {}
    rows = await session.exec(select(DbWorker.id, DbWorker.name).where(DbWorker.id.in_(worker_ids)))
    return dict(rows.all())


async def register_worker(
    session: AsyncSession,
    name: str,
    allowed_models: list[str] | None,
    max_slots: int | None,
    max_sockets: int | None,
) -> tuple[DbWorker, str]:
    """Register a worker (committed): the row and its API key, which is not stored."""
    key, key_hash, prefix = new_worker_key()
    worker = DbWorker(
        name=name,
        api_key_hash=key_hash,
        api_key_prefix=prefix,
        allowed_models=allowed_models,
        max_slots=max_slots,
        max_sockets=max_sockets,
    )
    session.add(worker)
    await session.commit()
    return worker, key


async def all_workers(session: AsyncSession) -> list[DbWorker]:
    """Every registered worker, oldest first."""
    return list((await session.exec(select(DbWorker).order_by(DbWorker.created_at))).all())


async def get_worker(session: AsyncSession, worker_id: str) -> DbWorker:
    worker = await session.get(DbWorker, worker_id)
    if worker is None:
        raise not_found("worker")
    return worker


async def new_key_for_worker(session: AsyncSession, worker_id: str) -> tuple[DbWorker, str]:
    """Give the worker a new API key (committed): the row and the key; the old key stops working."""
    worker = await get_worker(session, worker_id)
    key, worker.api_key_hash, worker.api_key_prefix = new_worker_key()
    session.add(worker)
    await session.commit()
    return worker, key


async def update_worker_limits(
    session: AsyncSession,
    worker_id: str,
    allowed_models: list[str] | None,
    max_slots: int | None,
    max_sockets: int | None,
) -> DbWorker:
    """Replace what the worker's key allows (committed)."""
    worker = await get_worker(session, worker_id)
    worker.allowed_models, worker.max_slots, worker.max_sockets = allowed_models, max_slots, max_sockets
    session.add(worker)
    await session.commit()
    return worker


async def update_worker_trust(
    session: AsyncSession, worker_id: str, trusted: bool, clear_flag: bool
) -> DbWorker:
    """Trust the worker's key or not, and clear its compliance flag if asked (committed)."""
    worker = await get_worker(session, worker_id)
    worker.trusted = trusted
    if clear_flag:
        worker.flagged_at, worker.flag_reason, worker.checks_cleared_at = None, None, utcnow()
    session.add(worker)
    await session.commit()
    return worker


async def remove_worker(session: AsyncSession, worker_id: str) -> None:
    """Delete the worker and its key (committed; ``not_found`` if there is no such worker)."""
    result = await session.exec(delete(DbWorker).where(DbWorker.id == worker_id))
    await session.commit()
    if result.rowcount != 1:
        raise not_found("worker")
