from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import select

from oasst_inference_server.auth import create_token
from oasst_inference_server.deps import CurrentUser, SessionDep, SettingsDep
from oasst_inference_server.errors import ApiError
from oasst_inference_server.models import DbUser
from oasst_shared.schemas import LoginResponse, TokenPair

router = APIRouter(prefix="/auth", tags=["auth"])


@router.get(
    "/callback/debug",
    response_model=LoginResponse,
    responses={403: {"description": "Debug login is disabled"}, 422: {"description": "Invalid username"}},
)
async def debug_login(
    settings: SettingsDep,
    session: SessionDep,
    code: Annotated[str, Query(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@-]+$")],
) -> LoginResponse:
    """Log in as ``code`` without a password (development only: ``OASST_SERVER_ALLOW_DEBUG_AUTH``)."""
    if not settings.allow_debug_auth:
        raise ApiError(403, "debug_auth_disabled", "debug login is disabled on this server")
    user = (
        await session.execute(
            select(DbUser).where(DbUser.provider == "debug", DbUser.provider_account_id == code)
        )
    ).scalar_one_or_none()
    if user is None:
        user = DbUser(provider="debug", provider_account_id=code, display_name=code)
        session.add(user)
        await session.commit()
    if user.deleted:
        raise ApiError(403, "user_deleted", "this account was deleted")
    return LoginResponse(
        access_token=TokenPair(access_token=create_token(settings, user.id, "access")),
        refresh_token=TokenPair(access_token=create_token(settings, user.id, "refresh")),
    )


@router.get("/check", responses={401: {"description": "Not authenticated"}})
async def check(user: CurrentUser) -> dict[str, str]:
    """The id of the user the bearer token belongs to."""
    return {"user_id": user.id, "display_name": user.display_name}
