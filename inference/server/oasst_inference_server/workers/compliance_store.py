"""Compliance checks in the database: each result per worker, the failures that count toward a flag,
and flagging a key (the dispatcher then gives it no user work, on every replica).

A registered key's failures are counted across its sockets since an admin last cleared its flag, and
the flag is stored on the key; a static key (``settings.worker_api_keys``) has no row, so its
failures are counted and its flag kept per socket.
"""

from __future__ import annotations

from dataclasses import dataclass

from loguru import logger
from sqlalchemy import func
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server import events, metrics
from oasst_inference_server.broker import Broker, BrokerError, WorkerSession
from oasst_inference_server.db.models import DbComplianceCheck, DbWorker, utcnow

PASSED = "passed"
FAILED = "failed"
INCONCLUSIVE = "inconclusive"
_TEXT_LIMIT = 20_000


@dataclass(frozen=True)
class CheckResult:
    worker_id: str | None
    session_id: str
    model_config_name: str
    kind: str  # "output" | "spot" | "usage"
    outcome: str
    detail: str
    reference_session_id: str | None = None
    prompt: str | None = None
    expected_text: str | None = None
    actual_text: str | None = None


async def record_check(sessions: async_sessionmaker[AsyncSession], result: CheckResult) -> int:
    """Store ``result``; the failed checks that now count toward the worker's flag."""
    metrics.COMPLIANCE_CHECKS.labels(result.model_config_name, result.kind, result.outcome).inc()
    log = logger.warning if result.outcome == FAILED else logger.info
    log(
        "compliance check ({}) of worker {}: {}: {}",
        result.kind,
        result.session_id,
        result.outcome,
        result.detail,
    )
    async with sessions() as session:
        session.add(
            DbComplianceCheck(
                worker_id=result.worker_id,
                session_id=result.session_id,
                reference_session_id=result.reference_session_id,
                model_config_name=result.model_config_name,
                kind=result.kind,
                outcome=result.outcome,
                detail=result.detail[:2000],
                prompt=result.prompt,
                expected_text=_bounded(result.expected_text),
                actual_text=_bounded(result.actual_text),
            )
        )
        await session.commit()
        query = select(func.count()).select_from(DbComplianceCheck).where(DbComplianceCheck.outcome == FAILED)
        if result.worker_id is None:
            query = query.where(DbComplianceCheck.session_id == result.session_id)
        else:
            query = query.where(DbComplianceCheck.worker_id == result.worker_id)
            worker = await session.get(DbWorker, result.worker_id)
            if worker is not None and worker.checks_cleared_at is not None:
                query = query.where(DbComplianceCheck.created_at > worker.checks_cleared_at)
        return int((await session.exec(query)).one())


def _bounded(text: str | None) -> str | None:
    return None if text is None else text[:_TEXT_LIMIT]


async def flag_worker(sessions: async_sessionmaker[AsyncSession], worker_id: str, reason: str) -> bool:
    """Flag a registered key; False when it was flagged already (or is gone)."""
    async with sessions() as session:
        worker = await session.get(DbWorker, worker_id)
        if worker is None or worker.flagged_at is not None:
            return False
        worker.flagged_at, worker.flag_reason = utcnow(), reason[:2000]
        session.add(worker)
        await session.commit()
    metrics.WORKERS_FLAGGED.inc()
    logger.warning("worker key {} is flagged: {}", worker_id, reason)
    return True


async def list_checks(
    session: AsyncSession,
    *,
    worker_id: str | None = None,
    session_id: str | None = None,
    outcome: str | None = None,
    limit: int = 50,
) -> list[DbComplianceCheck]:
    """Checks, newest first."""
    query = select(DbComplianceCheck)
    if worker_id is not None:
        query = query.where(DbComplianceCheck.worker_id == worker_id)
    if session_id is not None:
        query = query.where(DbComplianceCheck.session_id == session_id)
    if outcome is not None:
        query = query.where(DbComplianceCheck.outcome == outcome)
    query = query.order_by(DbComplianceCheck.created_at.desc(), DbComplianceCheck.id).limit(limit)
    return list((await session.exec(query)).all())


# Published on the command channel of each socket of a flagged key (on any replica): no more user work.
FLAG_COMMAND = '{"type":"flagged"}'


class ComplianceRecorder:
    """Records check results and flags a worker past ``settings.compliance_fail_threshold`` failures."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], broker: Broker, threshold: int) -> None:
        self._sessions = sessions
        self._broker = broker
        self._threshold = threshold

    async def record(self, result: CheckResult) -> bool:
        """Store the result; True when it flagged the worker."""
        try:
            failures = await record_check(self._sessions, result)
        except Exception as exc:  # a database hiccup costs a check, not the connection
            logger.warning("compliance check of {} not recorded: {}", result.session_id, exc)
            return False
        if result.outcome != FAILED or failures < self._threshold:
            return False
        reason = f"{failures} failed compliance checks; last: {result.detail}"
        if result.worker_id is not None and not await flag_worker(self._sessions, result.worker_id, reason):
            return False
        if result.worker_id is None:
            metrics.WORKERS_FLAGGED.inc()
            logger.warning("worker {} (a static key) is flagged: {}", result.session_id, reason)
        await self._tell_sessions(result)
        return True

    async def _tell_sessions(self, result: CheckResult) -> None:
        targets = {result.session_id}
        if result.worker_id is not None:
            for record in await self._broker.list_worker_sessions():
                live = WorkerSession.of(record)
                if live is not None and live.worker_id == result.worker_id:
                    targets.add(record.session_id)
        for session_id in targets:
            try:
                await self._broker.publish_command(events.worker_command_channel(session_id), FLAG_COMMAND)
            except BrokerError as exc:
                logger.warning("could not tell worker {} it is flagged: {}", session_id, exc)
