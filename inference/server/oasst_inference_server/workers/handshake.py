"""The worker socket's handshake: the API key (static or registered), the protocol version, the
worker's ``worker_info`` and its key's limits; then the connection runs (:mod:`.worker_connection`)
until the socket ends, its start and end recorded on the worker's key.

May import workers' lower modules, dispatch, auth, broker, settings; not api or anything above.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
from dataclasses import dataclass

from fastapi import WebSocket
from loguru import logger
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel.ext.asyncio.session import AsyncSession
from starlette.websockets import WebSocketDisconnect

from oasst_inference_server.auth.worker_keys import (
    KeyCheckUnavailable,
    find_worker_by_key,
    key_refusal,
    record_worker_event,
)
from oasst_inference_server.broker import Broker
from oasst_inference_server.dispatch.message_lifecycle import MessageLifecycle
from oasst_inference_server.moderation.hook import Moderation
from oasst_inference_server.scheduling.dispatcher import Dispatchers
from oasst_inference_server.settings import Settings
from oasst_inference_server.workers.compliance import ComplianceChecker
from oasst_inference_server.workers.compliance_store import ComplianceRecorder
from oasst_inference_server.workers.key_limits import KeyLimits
from oasst_inference_server.workers.trust import WorkerTrust
from oasst_inference_server.workers.worker_connection import WorkerConnection
from oasst_shared.protocol import (
    API_KEY_HEADER,
    CLOSE_KEY_FORBIDS,
    CLOSE_POLICY_VIOLATION,
    CLOSE_TRY_AGAIN_LATER,
    CLOSE_UNSUPPORTED_DATA,
    CLOSE_UNSUPPORTED_PROTOCOL,
    MAX_FRAME_BYTES,
    MIN_SUPPORTED_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    PROTOCOL_VERSION_HEADER,
    ProtocolError,
    UpgradeRequired,
    WorkerInfo,
    dump_frame,
    fits_in_frame,
    parse_worker_frame,
)


@dataclass(frozen=True)
class WorkerServices:
    """What a worker's connection is built with (the services built once at startup)."""

    settings: Settings
    sessions: async_sessionmaker[AsyncSession]
    broker: Broker
    lifecycle: MessageLifecycle
    dispatchers: Dispatchers
    compliance: ComplianceRecorder
    spot_checks: ComplianceChecker
    moderation: Moderation | None = None


def _key_is_valid(key: str | None, valid_keys: list[str]) -> bool:
    if not key:
        return False
    return any(hmac.compare_digest(key.encode(), k.encode()) for k in valid_keys)


def _protocol_version(raw: str) -> int:
    """The version a worker's header names; 0 (unsupported) unless it is a few ASCII digits (``isdigit``
    alone also takes digits such as a superscript two, which ``int`` refuses)."""
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 6 else 0


async def serve_worker(websocket: WebSocket, services: WorkerServices) -> None:
    """The worker socket: API-key and protocol-version handshake, then the frames of oasst_shared.protocol."""
    settings, sessions, broker = services.settings, services.sessions, services.broker
    lifecycle, dispatchers = services.lifecycle, services.dispatchers
    compliance, spot_checks = services.compliance, services.spot_checks
    key = websocket.headers.get(API_KEY_HEADER)
    trusted_static_key = _key_is_valid(key, settings.trusted_worker_api_keys)
    static_key = trusted_static_key or _key_is_valid(key, settings.worker_api_keys)
    # Besides the static keys of settings: the keys of workers registered through the admin API.
    try:
        registered = None if static_key else await find_worker_by_key(sessions, key)
    except KeyCheckUnavailable:
        # The database is briefly down: "try again later" (1013), which the worker retries, rather
        # than the 403 of a bad key, which it takes as final.
        await websocket.accept()
        await _close_quietly(websocket, CLOSE_TRY_AGAIN_LATER, "cannot check the API key now")
        return
    if not static_key and registered is None:
        logger.warning("refused a worker from {}: bad API key", websocket.client)
        await websocket.close(code=CLOSE_POLICY_VIOLATION)  # before accept: an HTTP 403
        return
    await websocket.accept()
    raw_version = websocket.headers.get(PROTOCOL_VERSION_HEADER, "")
    version = _protocol_version(raw_version)
    if not MIN_SUPPORTED_PROTOCOL_VERSION <= version <= PROTOCOL_VERSION:
        detail = (
            f"this server speaks worker protocol {MIN_SUPPORTED_PROTOCOL_VERSION}..{PROTOCOL_VERSION}, "
            f"the worker sent {raw_version[:16] or 'none'}: upgrade the "
            f"{'worker' if version < MIN_SUPPORTED_PROTOCOL_VERSION else 'server'}"
        )
        logger.warning("refused a worker from {}: {}", websocket.client, detail)
        frame = UpgradeRequired(
            server_protocol_version=PROTOCOL_VERSION,
            min_supported_version=MIN_SUPPORTED_PROTOCOL_VERSION,
            detail=detail,
        )
        await websocket.send_text(dump_frame(frame))
        await websocket.close(code=CLOSE_UNSUPPORTED_PROTOCOL, reason="protocol version not supported")
        return
    try:
        text = await asyncio.wait_for(websocket.receive_text(), timeout=settings.worker_hello_timeout)
        if not fits_in_frame(text):
            raise ProtocolError(f"frame over the limit of {MAX_FRAME_BYTES} bytes")
        info = parse_worker_frame(text)
    except (asyncio.TimeoutError, WebSocketDisconnect):
        logger.warning("worker from {} never described itself", websocket.client)
        await _close_quietly(websocket, CLOSE_POLICY_VIOLATION, "expected worker_info")
        return
    except ProtocolError as exc:
        await _close_quietly(websocket, CLOSE_POLICY_VIOLATION, f"malformed worker_info: {exc}"[:120])
        return
    except KeyError:  # starlette's receive_text on a binary frame
        await _close_quietly(websocket, CLOSE_UNSUPPORTED_DATA, "binary frames are not part of the protocol")
        return
    if not isinstance(info, WorkerInfo):
        await _close_quietly(websocket, CLOSE_POLICY_VIOLATION, "the first frame must be worker_info")
        return
    refusal = await key_refusal(info, registered, settings, broker)
    if refusal is not None:
        logger.warning("refused a worker from {}: {}", websocket.client, refusal)
        await _close_quietly(websocket, CLOSE_KEY_FORBIDS, refusal[:120])
        return
    slots = settings.max_slots_per_worker
    if registered is not None and registered.max_slots is not None:
        slots = min(slots, registered.max_slots)
    limits = KeyLimits(slots, registered.allowed_models if registered is not None else None)
    connection = WorkerConnection(
        websocket,
        info,
        settings=settings,
        broker=broker,
        lifecycle=lifecycle,
        protocol_version=version,
        worker_id=registered.id if registered else None,
        dispatcher=dispatchers.for_model(info.model_config_.name),
        trust=WorkerTrust(
            trusted=trusted_static_key or (registered is not None and registered.trusted),
            flagged=registered is not None and registered.flagged_at is not None,
            flag_reason=registered.flag_reason if registered else None,
        ),
        compliance=compliance,
        spot_checks=spot_checks,
        dispatchers=dispatchers,
        key_limits=limits,
        moderation=services.moderation,
    )
    record = functools.partial(
        record_worker_event,
        sessions,
        worker_id=registered.id if registered else None,
        session_id=connection.session_id,
        model_config_name=info.model_config_.name,
    )
    details = {
        "backend_kind": info.backend_kind,
        "max_parallel_requests": info.max_parallel_requests,
        "backend_model_id": info.backend_model_id,
        "backend_model_revision": info.backend_model_revision,
        "backend_version": info.backend_version,
        "trusted": connection.trust.trusted,
        "loaded": connection.loaded,
        "servable": sorted(connection.servable),
    }
    await record(event_type="connected", details=details)
    try:
        await connection.run()
    finally:
        await record(event_type="disconnected")


async def _close_quietly(websocket: WebSocket, code: int, reason: str) -> None:
    try:
        await websocket.close(code=code, reason=reason)
    except RuntimeError:
        pass
