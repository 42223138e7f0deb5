"""The worker socket's route: the handshake and the connection live in :mod:`..workers.handshake`."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from oasst_inference_server.api.deps import (
    BrokerDep,
    ComplianceDep,
    DispatchersDep,
    LifecycleDep,
    ModerationDep,
    SessionFactoryDep,
    SettingsDep,
    SpotChecksDep,
)
from oasst_inference_server.workers.handshake import WorkerServices, serve_worker

router = APIRouter(prefix="/workers", tags=["workers"])


@router.websocket("/work")
async def worker_work(
    websocket: WebSocket,
    settings: SettingsDep,
    sessions: SessionFactoryDep,
    broker: BrokerDep,
    lifecycle: LifecycleDep,
    dispatchers: DispatchersDep,
    compliance: ComplianceDep,
    spot_checks: SpotChecksDep,
    moderation: ModerationDep,
) -> None:
    """The worker socket: API-key and protocol-version handshake, then the frames of oasst_shared.protocol."""
    services = WorkerServices(
        settings, sessions, broker, lifecycle, dispatchers, compliance, spot_checks, moderation
    )
    await serve_worker(websocket, services)
