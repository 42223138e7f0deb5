"""Admin users through the admin API: make a user an admin (their access token then opens the admin API
and the web chat's admin page) or not."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from oasst_inference_server.api.deps import SessionDep, SettingsDep, UserCacheDep
from oasst_inference_server.api.responses import ADMIN, error
from oasst_inference_server.api.routes.admin import get_user, require_admin
from oasst_inference_server.auth.admin_users import change_user_admin
from oasst_inference_server.auth.users import find_user
from oasst_shared.schemas import AdminUserRead, UserAdminUpdate

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin)], responses=ADMIN)


@router.put("/users/{user_id}/admin", response_model=AdminUserRead, responses={404: error("No such user")})
async def set_user_admin(
    user_id: str, body: UserAdminUpdate, session: SessionDep, settings: SettingsDep, users: UserCacheDep
) -> AdminUserRead:
    """Make the user an admin user or not; it takes effect on the admin API at once, everywhere
    (``is_admin`` stays true for a user that ``settings.admin_users`` lists)."""
    user = await find_user(session, user_id, deleted_too=False)
    await change_user_admin(session, user, body.admin)
    users.forget(user_id)
    return await get_user(user_id, session, settings)
