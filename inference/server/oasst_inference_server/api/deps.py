"""FastAPI dependencies, as annotated aliases so route signatures read like sentences.

The services are built once, at startup (``main.create_app``'s lifespan keeps them on ``app.state``);
routes reach them only through these aliases (``LifecycleDep``, ``SubmissionDep``...), which work on
HTTP requests and websockets alike.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel.ext.asyncio.session import AsyncSession
from starlette.requests import HTTPConnection

from oasst_inference_server.api.scheduling_options import (
    PriorityHeader,
    QueueTimeoutHeader,
    TrustedClientHeader,
    parse_scheduling_request,
)
from oasst_inference_server.auth.api_key_store import authenticate_api_key, is_api_key
from oasst_inference_server.auth.caller import Caller
from oasst_inference_server.auth.signed_tokens import verify_token
from oasst_inference_server.auth.trusted_client import TRUSTED_CLIENT_HEADER, trusted_client_user
from oasst_inference_server.auth.user_cache import UserCache
from oasst_inference_server.broker import Broker
from oasst_inference_server.db.models import DbUser
from oasst_inference_server.dispatch.compliance import ComplianceChecker
from oasst_inference_server.dispatch.compliance_store import ComplianceRecorder
from oasst_inference_server.dispatch.dispatcher import Dispatchers
from oasst_inference_server.dispatch.message_lifecycle import MessageLifecycle
from oasst_inference_server.dispatch.worker_registry import WorkerRegistry
from oasst_inference_server.domain_errors import NotAuthenticated
from oasst_inference_server.openai_api.openai_service import OpenAIService
from oasst_inference_server.settings import Settings
from oasst_inference_server.streams.fanout import StreamFanout
from oasst_inference_server.submission import SubmissionService
from oasst_shared.schemas import SchedulingRequest


def _from_app_state(name: str) -> Callable[[HTTPConnection], Awaitable[Any]]:
    """A dependency that returns what the lifespan stored as ``app.state.<name>``.

    A coroutine function although it never awaits: FastAPI runs a plain function dependency in its
    thread pool, a hand-off to a thread and back for every one of them on every request."""

    async def dependency(connection: HTTPConnection) -> Any:
        return getattr(connection.app.state, name)

    dependency.__name__ = f"get_{name}"
    return dependency


async def get_db(connection: HTTPConnection) -> AsyncIterator[AsyncSession]:
    async with connection.app.state.session_factory() as session:
        yield session


SettingsDep = Annotated[Settings, Depends(_from_app_state("settings"))]
BrokerDep = Annotated[Broker, Depends(_from_app_state("broker"))]
StreamFanoutDep = Annotated[StreamFanout, Depends(_from_app_state("stream_fanout"))]
RegistryDep = Annotated[WorkerRegistry, Depends(_from_app_state("registry"))]
LifecycleDep = Annotated[MessageLifecycle, Depends(_from_app_state("lifecycle"))]
DispatchersDep = Annotated[Dispatchers, Depends(_from_app_state("dispatchers"))]
ComplianceDep = Annotated[ComplianceRecorder, Depends(_from_app_state("compliance"))]
SpotChecksDep = Annotated[ComplianceChecker, Depends(_from_app_state("compliance_checker"))]
SubmissionDep = Annotated[SubmissionService, Depends(_from_app_state("submission"))]
OpenAIServiceDep = Annotated[OpenAIService, Depends(_from_app_state("openai_service"))]
UserCacheDep = Annotated[UserCache, Depends(_from_app_state("user_cache"))]
# For work that outlives a request's session (a websocket's whole life, a report over many queries).
SessionFactoryDep = Annotated[async_sessionmaker[AsyncSession], Depends(_from_app_state("session_factory"))]
SessionDep = Annotated[AsyncSession, Depends(get_db)]

_bearer = HTTPBearer(auto_error=False)
_trusted_client = APIKeyHeader(name=TRUSTED_CLIENT_HEADER, auto_error=False, scheme_name="TrustedClient")


async def _user_of_access_token(
    settings: Settings, session: AsyncSession, users: UserCache, token: str
) -> DbUser:
    user_id, generation = verify_token(settings, token, "access")
    user = await users.get(session, user_id)
    if user is None or user.deleted:
        raise NotAuthenticated("invalid_token", "unknown user", bearer=True)
    if generation != user.token_generation:
        raise NotAuthenticated("token_revoked", "this token was revoked: sign in again", bearer=True)
    return user


async def _user_of_api_key(session: AsyncSession, key: str) -> tuple[DbUser, str]:
    found = await authenticate_api_key(session, key)
    if found is None:
        raise NotAuthenticated("invalid_api_key", "invalid or revoked API key", bearer=True)
    user, row = found
    return user, row.id


async def get_signed_in_user(
    settings: SettingsDep,
    session: SessionDep,
    users: UserCacheDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    trusted_client: Annotated[str | None, Depends(_trusted_client)],
) -> DbUser:
    """The user of a bearer access token, or the one a trusted frontend speaks for (no API key:
    managing keys and the account needs a sign-in)."""
    if trusted_client is not None:
        return await trusted_client_user(session, settings, trusted_client)
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise NotAuthenticated("not_authenticated", "not authenticated", bearer=True)
    return await _user_of_access_token(settings, session, users, credentials.credentials)


async def get_current_user(
    settings: SettingsDep,
    session: SessionDep,
    users: UserCacheDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    trusted_client: Annotated[str | None, Depends(_trusted_client)],
) -> DbUser:
    """As ``get_signed_in_user``, and also the owner of an API key (``Bearer oak-...``): clients
    without a browser, such as the text-client, chat with a key."""
    if trusted_client is None and credentials is not None and is_api_key(credentials.credentials):
        return (await _user_of_api_key(session, credentials.credentials))[0]
    return await get_signed_in_user(settings, session, users, credentials, trusted_client)


SignedInUser = Annotated[DbUser, Depends(get_signed_in_user)]
CurrentUser = Annotated[DbUser, Depends(get_current_user)]


async def get_scheduling_request(
    settings: SettingsDep,
    priority: PriorityHeader = None,
    queue_timeout: QueueTimeoutHeader = None,
    trusted_client: TrustedClientHeader = None,
) -> SchedulingRequest:
    """The request's scheduling options (``X-Priority``, ``X-Queue-Timeout``), checked."""
    return parse_scheduling_request(settings, priority, queue_timeout, trusted_client)


SchedulingDep = Annotated[SchedulingRequest, Depends(get_scheduling_request)]


async def get_caller(
    settings: SettingsDep,
    session: SessionDep,
    users: UserCacheDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    scheduling: SchedulingDep,
) -> Caller:
    """Accept an API key (``Authorization: Bearer oak-...``) or a user's access token."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise NotAuthenticated("missing_api_key", "no API key: send Authorization: Bearer <key>", bearer=True)
    token = credentials.credentials
    if is_api_key(token):
        user, key_id = await _user_of_api_key(session, token)
        return Caller(user, key_id, scheduling)
    return Caller(await _user_of_access_token(settings, session, users, token), scheduling=scheduling)


ApiCaller = Annotated[Caller, Depends(get_caller)]
