"""FastAPI dependencies, as annotated aliases so route signatures read like sentences."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.auth import verify_token
from oasst_inference_server.broker import Broker
from oasst_inference_server.errors import ApiError
from oasst_inference_server.models import DbUser
from oasst_inference_server.settings import Settings
from oasst_inference_server.worker_registry import WorkerRegistry


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


async def get_current_user(
    settings: SettingsDep,
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> DbUser:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise ApiError(401, "not_authenticated", "not authenticated", {"WWW-Authenticate": "Bearer"})
    user_id = verify_token(settings, credentials.credentials, "access")
    user = await session.get(DbUser, user_id)
    if user is None or user.deleted:
        raise ApiError(401, "invalid_token", "unknown user", {"WWW-Authenticate": "Bearer"})
    return user


CurrentUser = Annotated[DbUser, Depends(get_current_user)]
