"""FastAPI dependencies, as annotated aliases so route signatures read like sentences."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from sqlmodel.ext.asyncio.session import AsyncSession

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
from oasst_inference_server.broker import Broker
from oasst_inference_server.db.models import DbUser
from oasst_inference_server.dispatch.worker_registry import WorkerRegistry
from oasst_inference_server.errors import ApiError
from oasst_inference_server.settings import Settings
from oasst_shared.schemas import SchedulingRequest


def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


def get_broker(request: Request) -> Broker:
    return request.app.state.broker


def get_registry(request: Request) -> WorkerRegistry:
    return request.app.state.registry


async def get_db(request: Request) -> AsyncIterator[AsyncSession]:
    async with request.app.state.session_factory() as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
BrokerDep = Annotated[Broker, Depends(get_broker)]
RegistryDep = Annotated[WorkerRegistry, Depends(get_registry)]
SessionDep = Annotated[AsyncSession, Depends(get_db)]

_bearer = HTTPBearer(auto_error=False)
_trusted_client = APIKeyHeader(name=TRUSTED_CLIENT_HEADER, auto_error=False, scheme_name="TrustedClient")


async def _user_of_access_token(settings: Settings, session: AsyncSession, token: str) -> DbUser:
    user_id, generation = verify_token(settings, token, "access")
    user = await session.get(DbUser, user_id)
    if user is None or user.deleted:
        raise ApiError(401, "invalid_token", "unknown user", {"WWW-Authenticate": "Bearer"})
    if generation != user.token_generation:
        raise ApiError(
            401, "token_revoked", "this token was revoked: sign in again", {"WWW-Authenticate": "Bearer"}
        )
    return user


async def _user_of_api_key(session: AsyncSession, key: str) -> tuple[DbUser, str]:
    found = await authenticate_api_key(session, key)
    if found is None:
        raise ApiError(401, "invalid_api_key", "invalid or revoked API key", {"WWW-Authenticate": "Bearer"})
    user, row = found
    return user, row.id


async def get_signed_in_user(
    settings: SettingsDep,
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    trusted_client: Annotated[str | None, Depends(_trusted_client)],
) -> DbUser:
    """The user of a bearer access token, or the one a trusted frontend speaks for (no API key:
    managing keys and the account needs a sign-in)."""
    if trusted_client is not None:
        return await trusted_client_user(session, settings, trusted_client)
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise ApiError(401, "not_authenticated", "not authenticated", {"WWW-Authenticate": "Bearer"})
    return await _user_of_access_token(settings, session, credentials.credentials)


async def get_current_user(
    settings: SettingsDep,
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    trusted_client: Annotated[str | None, Depends(_trusted_client)],
) -> DbUser:
    """As ``get_signed_in_user``, and also the owner of an API key (``Bearer oak-...``): clients
    without a browser, such as the text-client, chat with a key."""
    if trusted_client is None and credentials is not None and is_api_key(credentials.credentials):
        return (await _user_of_api_key(session, credentials.credentials))[0]
    return await get_signed_in_user(settings, session, credentials, trusted_client)


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
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    scheduling: SchedulingDep,
) -> Caller:
    """Accept an API key (``Authorization: Bearer oak-...``) or a user's access token."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise ApiError(
            401,
            "missing_api_key",
            "no API key: send Authorization: Bearer <key>",
            {"WWW-Authenticate": "Bearer"},
        )
    token = credentials.credentials
    if is_api_key(token):
        user, key_id = await _user_of_api_key(session, token)
        return Caller(user, key_id, scheduling)
    return Caller(await _user_of_access_token(settings, session, token), scheduling=scheduling)


ApiCaller = Annotated[Caller, Depends(get_caller)]
