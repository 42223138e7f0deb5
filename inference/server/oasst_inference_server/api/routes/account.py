"""The signed-in user's own account."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from oasst_inference_server.api.deps import LifecycleDep, SessionDep, SettingsDep, SignedInUser, UserCacheDep
from oasst_inference_server.api.responses import AUTH, error
from oasst_inference_server.api.routes.auth import user_read
from oasst_inference_server.auth.admin_users import is_admin
from oasst_inference_server.chats.accounts import delete_account
from oasst_inference_server.chats.user_settings import load_user_settings, save_user_settings
from oasst_shared.schemas import AccountRead, UserSettings

router = APIRouter(prefix="/account", tags=["account"])


@router.get("", response_model=AccountRead, responses=AUTH)
async def get_account(user: SignedInUser, settings: SettingsDep) -> AccountRead:
    """The signed-in user; ``is_admin`` tells a client (the web chat) to offer the admin page."""
    return AccountRead(**user_read(user).model_dump(), is_admin=is_admin(settings, user))


@router.delete("", status_code=204, responses=AUTH)
async def delete_own_account(
    user: SignedInUser, session: SessionDep, lifecycle: LifecycleDep, users: UserCacheDep
) -> Response:
    """Delete the account: running answers are cancelled, chats that did not allow data use are
    deleted, the rest is kept anonymised, and every token stops working."""
    user_id = user.id
    await delete_account(session, lifecycle, user)
    users.forget(user_id)
    return Response(status_code=204)


@router.get("/settings", response_model=UserSettings, responses=AUTH)
async def get_user_settings(user: SignedInUser, session: SessionDep) -> UserSettings:
    """The user's client settings (the defaults until the first ``PUT``)."""
    return await load_user_settings(session, user.id)


@router.put(
    "/settings",
    response_model=UserSettings,
    responses={**AUTH, 422: error("Invalid fields, or more than 8 KiB of settings")},
)
async def put_user_settings(body: UserSettings, user: SignedInUser, session: SessionDep) -> UserSettings:
    """Replace the user's client settings (omitted fields return to their defaults)."""
    return await save_user_settings(session, user.id, body)
