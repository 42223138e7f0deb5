"""The admin API, behind ``settings.admin_root_token`` or an admin user's access token: workers and their
keys, live worker sessions, the fleet's models and moves, and users. Without a root token only admin users
get in (403 ``admin_disabled`` for any other token)."""

from __future__ import annotations

import hmac
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from oasst_inference_server.api.deps import (
    BrokerDep,
    LifecycleDep,
    ModelSwitcherDep,
    RebalancerDep,
    RegistryDep,
    SessionDep,
    SessionFactoryDep,
    SettingsDep,
    UserCacheDep,
)
from oasst_inference_server.api.responses import ADMIN, Responses, error
from oasst_inference_server.auth.admin_users import admin_of_access_token, is_admin, looks_like_access_token
from oasst_inference_server.auth.refresh_tokens import revoke_user_tokens
from oasst_inference_server.auth.users import change_user_tier, find_user
from oasst_inference_server.auth.worker_admin import (
    all_workers,
    new_key_for_worker,
    register_worker,
    remove_worker,
    session_workers,
    update_worker_limits,
    update_worker_trust,
    worker_names,
)
from oasst_inference_server.auth.worker_keys import live_sessions_of
from oasst_inference_server.broker import WorkerSession
from oasst_inference_server.chats.accounts import delete_account
from oasst_inference_server.chats.chat_store import count_user_chats
from oasst_inference_server.db.models import DbWorker
from oasst_inference_server.domain_errors import InvalidValue, NotAuthenticated, NotPermitted
from oasst_inference_server.events import worker_command_channel
from oasst_inference_server.fleet.views import (
    FleetCommandAccepted,
    FleetMove,
    FleetUnload,
    FleetView,
    fleet_view,
)
from oasst_inference_server.scheduling.queue_status import queue_status
from oasst_inference_server.scheduling.rebalancer import RebalancerStatus
from oasst_inference_server.workers.compliance_store import list_checks
from oasst_inference_server.workers.worker_connection import DISCONNECT_COMMAND
from oasst_shared.schemas import (
    AdminUserRead,
    ComplianceCheckRead,
    CreateWorkerRequest,
    QueueStatus,
    RevokedTokensResponse,
    UserTierUpdate,
    WorkerCreated,
    WorkerLimits,
    WorkerRead,
    WorkerSessionRead,
    WorkerTrustUpdate,
)

_admin_bearer = HTTPBearer(auto_error=False, scheme_name="AdminToken")


async def require_admin(
    settings: SettingsDep,
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_admin_bearer)],
) -> None:
    """The root token, or the access token of an admin user (auth/admin_users.py)."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise NotAuthenticated("not_authenticated", "admin token required", bearer=True)
    token = credentials.credentials
    root = settings.admin_root_token
    if root and hmac.compare_digest(token.encode(), root.encode()):
        return
    if looks_like_access_token(token):
        await admin_of_access_token(settings, session, token)
        return
    if not root:
        raise NotPermitted("admin_disabled", "the admin API is disabled on this server")
    raise NotPermitted("forbidden", "wrong admin token")


router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin)], responses=ADMIN)
_WORKER: Responses = {404: error("No such worker")}
_USER: Responses = {404: error("No such user")}


async def _session_counts(broker: BrokerDep, session: SessionDep) -> dict[str, int]:
    """Live sessions per registered worker id."""
    workers = await session_workers(session, [r.session_id for r in await broker.list_worker_sessions()])
    counts: dict[str, int] = {}
    for worker_id in workers.values():
        if worker_id is not None:
            counts[worker_id] = counts.get(worker_id, 0) + 1
    return counts


def _worker_read(worker: DbWorker, sessions: int = 0) -> WorkerRead:
    return WorkerRead(
        id=worker.id,
        name=worker.name,
        api_key_prefix=worker.api_key_prefix,
        created_at=worker.created_at,
        connected_sessions=sessions,
        allowed_models=worker.allowed_models,
        max_slots=worker.max_slots,
        max_sockets=worker.max_sockets,
        trusted=worker.trusted,
        flagged_at=worker.flagged_at,
        flag_reason=worker.flag_reason,
    )


async def _close_sockets(broker: BrokerDep, worker_id: str) -> None:
    """Close the worker's open sockets on every replica (the broker's command channel reaches them all)."""
    for session_id in await live_sessions_of(broker, worker_id):
        await broker.publish_command(worker_command_channel(session_id), DISCONNECT_COMMAND)


@router.post(
    "/workers", response_model=WorkerCreated, status_code=201, responses={422: error("Invalid name")}
)
async def create_worker(body: CreateWorkerRequest, session: SessionDep) -> WorkerCreated:
    """Register a worker; the response holds its API key, which is not shown again."""
    worker, key = await register_worker(
        session, body.name, body.allowed_models, body.max_slots, body.max_sockets
    )
    return WorkerCreated(**_worker_read(worker).model_dump(), api_key=key)


@router.get("/workers", response_model=list[WorkerRead])
async def list_workers(session: SessionDep, broker: BrokerDep) -> list[WorkerRead]:
    counts = await _session_counts(broker, session)
    workers = await all_workers(session)
    return [_worker_read(w, counts.get(w.id, 0)) for w in workers]


@router.post("/workers/{worker_id}/api_key", response_model=WorkerCreated, responses=_WORKER)
async def replace_worker_key(worker_id: str, session: SessionDep, broker: BrokerDep) -> WorkerCreated:
    """Issue a new API key for the worker; the old one stops working at once: the sockets opened with
    it, on every replica, are closed (their messages are retried elsewhere)."""
    worker, key = await new_key_for_worker(session, worker_id)
    await _close_sockets(broker, worker_id)
    return WorkerCreated(**_worker_read(worker).model_dump(), api_key=key)


@router.put("/workers/{worker_id}/limits", response_model=WorkerRead, responses=_WORKER)
async def set_worker_limits(
    worker_id: str, body: WorkerLimits, session: SessionDep, broker: BrokerDep
) -> WorkerRead:
    """Replace what the worker's key allows; its open sockets are closed and reconnect under the new
    limits (a worker that announces more than they allow is refused with close code 4003)."""
    worker = await update_worker_limits(
        session, worker_id, body.allowed_models, body.max_slots, body.max_sockets
    )
    await _close_sockets(broker, worker_id)
    return _worker_read(worker)


@router.put("/workers/{worker_id}/trust", response_model=WorkerRead, responses=_WORKER)
async def set_worker_trust(
    worker_id: str, body: WorkerTrustUpdate, session: SessionDep, broker: BrokerDep
) -> WorkerRead:
    """Trust the worker's key or not (trusted keys are never compliance-checked and answer the checks),
    and clear its compliance flag; its open sockets are closed and reconnect under the new trust."""
    worker = await update_worker_trust(session, worker_id, body.trusted, body.clear_flag)
    await _close_sockets(broker, worker_id)
    return _worker_read(worker)


@router.get("/compliance_checks", response_model=list[ComplianceCheckRead])
async def compliance_checks(
    session: SessionDep,
    worker_id: Annotated[str | None, Query(max_length=36)] = None,
    session_id: Annotated[str | None, Query(max_length=64)] = None,
    outcome: Annotated[Literal["passed", "failed", "inconclusive"] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> list[ComplianceCheckRead]:
    """Compliance checks of workers, newest first: each with the prompt and, for a mismatch, both
    answers (`outcome=failed` lists the failures; the first is the last mismatch)."""
    checks = await list_checks(
        session, worker_id=worker_id, session_id=session_id, outcome=outcome, limit=limit
    )
    return [ComplianceCheckRead.model_validate(c, from_attributes=True) for c in checks]


@router.delete("/workers/{worker_id}", status_code=204, responses=_WORKER)
async def delete_worker(worker_id: str, session: SessionDep, broker: BrokerDep) -> Response:
    """Delete the worker and its key (its connection history is kept). Its open sockets, on any
    replica, are closed (their messages are retried elsewhere) and it cannot reconnect."""
    # Find its sockets first: deleting the worker also deletes its connection events.
    live = await session_workers(session, [r.session_id for r in await broker.list_worker_sessions()])
    await remove_worker(session, worker_id)
    for session_id, owner in live.items():
        if owner == worker_id:
            await broker.publish_command(worker_command_channel(session_id), DISCONNECT_COMMAND)
    await _close_sockets(broker, worker_id)
    return Response(status_code=204)


# What the admin API shows of a worker session as the broker holds it (the worker comes from the database).
_SESSION_DETAILS = {
    "max_parallel_requests",
    "free_slots",
    "in_flight",
    "backend_kind",
    "backend_healthy",
    "draining",
    "worker_version",
    "connected_at",
    "backend_model_id",
    "backend_model_revision",
    "backend_version",
    "trusted",
    "flagged",
}


@router.get("/worker_sessions", response_model=list[WorkerSessionRead])
async def list_worker_sessions(session: SessionDep, broker: BrokerDep) -> list[WorkerSessionRead]:
    """Every connected worker socket on every replica, with its capacity and in-flight messages."""
    records = await broker.list_worker_sessions()
    workers = await session_workers(session, [r.session_id for r in records])
    names = await worker_names(session, {w for w in workers.values() if w is not None})
    out = []
    for record in sorted(records, key=lambda r: (r.model_config_name, r.session_id)):
        worker_id = workers.get(record.session_id)
        live = WorkerSession.of(record)
        # A record this version cannot read is listed without its details.
        details = live.model_dump(include=_SESSION_DETAILS) if live is not None else {}
        out.append(
            WorkerSessionRead(
                session_id=record.session_id,
                model_config_name=record.model_config_name,
                worker_id=worker_id,
                worker_name=names.get(worker_id) if worker_id else None,
                **details,
            )
        )
    return out


_MOVE: Responses = {
    404: error("No such worker session (`unknown_worker_session`)"),
    409: error(
        "The worker cannot make the switch now: `model_not_servable`, `worker_cannot_switch`, "
        "`worker_switching`, `already_loaded`, `already_unloaded`, `worker_draining`, `worker_gone`"
    ),
    503: error("The replica holding the worker's socket did not answer (`switch_unanswered`)"),
}


@router.get("/fleet", response_model=FleetView)
async def fleet(session: SessionDep, broker: BrokerDep, registry: RegistryDep) -> FleetView:
    """Every connected worker on every replica with what it serves, whether its backend holds a model, what
    it can load, the switch it is making (with its last progress) and how its last one ended; and per
    model, the workers that have it, can load it or are loading it, and its queue."""
    sessions = (await registry.sessions.snapshot(fresh=True)).sessions
    workers = await session_workers(session, list(sessions))
    names = await worker_names(session, {w for w in workers.values() if w is not None})
    owners = {sid: (wid, names.get(wid)) for sid, wid in workers.items() if wid is not None}
    return await fleet_view(broker, sessions, owners)


@router.post("/fleet/moves", response_model=FleetCommandAccepted, status_code=202, responses=_MOVE)
async def move_worker(body: FleetMove, switcher: ModelSwitcherDep) -> FleetCommandAccepted:
    """Tell a worker (on any replica) to load a model it lists as servable: it drains (its answers
    finish), unloads, loads and serves the new model, or its previous one if the load fails. Answers once
    the worker's replica sent the command; the switch's progress is in `GET /admin/fleet`."""
    await switcher.load(body.session_id, body.model_config_name, body.reason)
    return FleetCommandAccepted(
        session_id=body.session_id, action="load", model_config_name=body.model_config_name
    )


@router.post("/fleet/unloads", response_model=FleetCommandAccepted, status_code=202, responses=_MOVE)
async def unload_worker(body: FleetUnload, switcher: ModelSwitcherDep) -> FleetCommandAccepted:
    """Tell a worker to unload its model (it drains first, then serves nothing until a load)."""
    await switcher.unload(body.session_id, body.reason)
    return FleetCommandAccepted(session_id=body.session_id, action="unload")


@router.get("/rebalancer", response_model=RebalancerStatus)
async def rebalancer_status(rebalancer: RebalancerDep) -> RebalancerStatus:
    """The rebalancer as this replica knows it: its settings, whether this replica holds its lock, and
    its last decisions with their reasons (kept on the replica that made them: ask each replica, or the
    one holding the lock)."""
    return rebalancer.status()


@router.post("/users/{user_id}/revoke_tokens", response_model=RevokedTokensResponse, responses=_USER)
async def revoke_tokens(user_id: str, session: SessionDep, users: UserCacheDep) -> RevokedTokensResponse:
    """Sign the user out everywhere: every refresh token is revoked and every access token already
    issued stops working (at once on this server process, within ``user_cache_seconds`` on the
    others; the count is of refresh tokens)."""
    await find_user(session, user_id)
    revoked = await revoke_user_tokens(session, user_id)
    users.forget(user_id)
    return RevokedTokensResponse(revoked=revoked)


@router.delete("/users/{user_id}", status_code=204, responses=_USER)
async def delete_user(
    user_id: str, session: SessionDep, lifecycle: LifecycleDep, users: UserCacheDep
) -> Response:
    """Delete a user the way ``DELETE /account`` does (anonymised, generations cancelled)."""
    user = await find_user(session, user_id, deleted_too=False)
    await delete_account(session, lifecycle, user)
    users.forget(user_id)
    return Response(status_code=204)


@router.get("/users/{user_id}", response_model=AdminUserRead, responses=_USER)
async def get_user(user_id: str, session: SessionDep, settings: SettingsDep) -> AdminUserRead:
    """A user (deleted ones too), how many chats they have, and whether they are an admin user."""
    user = await find_user(session, user_id)
    chats = await count_user_chats(session, user_id)
    return AdminUserRead(
        id=user.id,
        provider=user.provider,
        provider_account_id=user.provider_account_id,
        display_name=user.display_name,
        created_at=user.created_at,
        deleted=user.deleted,
        chat_count=int(chats),
        tier=user.tier,
        is_admin=is_admin(settings, user),
    )


@router.put(
    "/users/{user_id}/tier", response_model=AdminUserRead, responses={**_USER, 422: error("Unknown tier")}
)
async def set_user_tier(
    user_id: str, body: UserTierUpdate, session: SessionDep, settings: SettingsDep, users: UserCacheDep
) -> AdminUserRead:
    """Set the user's tier (a key of ``settings.user_tiers``; null for the default): its weight in the
    fair queues, for the messages the user queues from now on."""
    user = await find_user(session, user_id)
    if body.tier is not None and body.tier not in settings.user_tiers:
        raise InvalidValue(
            "unknown_tier",
            f"unknown tier {body.tier!r}; tiers: {', '.join(sorted(settings.user_tiers))}",
        )
    await change_user_tier(session, user, body.tier)
    users.forget(user_id)
    return await get_user(user_id, session, settings)


@router.get("/queues", response_model=QueueStatus)
async def queues(sessions: SessionFactoryDep, broker: BrokerDep) -> QueueStatus:
    """Per model: depth and oldest wait, each waiting user's backlog and counter, each worker's load,
    and the tokens served per user in the last window."""
    return await queue_status(sessions, broker)
