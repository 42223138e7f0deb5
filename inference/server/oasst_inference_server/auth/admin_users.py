"""Admin users: users whose access token the admin API accepts, besides the root token.

A user is an admin when their ``is_admin`` flag is set (``PUT /admin/users/{id}/admin``,
``oasst-server admin set-admin``) or their sign-in identity (``PROVIDER:ACCOUNT_ID``) is listed in
``settings.admin_users``. The admin API reads the user from the database on every call, not from the
user cache: taking the flag away, revoking the user's tokens or deleting the user ends their admin
access at once, on every replica.
"""

from __future__ import annotations

from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.auth.signed_tokens import verify_token
from oasst_inference_server.db.models import DbUser
from oasst_inference_server.domain_errors import NotAuthenticated, NotPermitted
from oasst_inference_server.settings import Settings


def sign_in_identity(user: DbUser) -> str:
    """The user's ``PROVIDER:ACCOUNT_ID``, as ``settings.admin_users`` lists admins."""
    return f"{user.provider}:{user.provider_account_id}"


def is_admin(settings: Settings, user: DbUser) -> bool:
    return not user.deleted and (user.is_admin or sign_in_identity(user) in settings.admin_users)


def looks_like_access_token(token: str) -> bool:
    """A signed token (three dot-separated parts), not a root token or an API key."""
    return token.count(".") == 2


async def admin_of_access_token(settings: Settings, session: AsyncSession, token: str) -> DbUser:
    """The admin user of a valid access token: 401 for a token that is not good any more (the client
    refreshes it), 403 ``forbidden`` for a user who is not an admin."""
    user_id, generation = verify_token(settings, token, "access")
    # Read now, not from the user cache: a revoked admin must not keep access for the cache's lifetime.
    user = await session.get(DbUser, user_id, populate_existing=True)
    if user is None or user.deleted:
        raise NotAuthenticated("invalid_token", "unknown user", bearer=True)
    if generation != user.token_generation:
        raise NotAuthenticated("token_revoked", "this token was revoked: sign in again", bearer=True)
    if not is_admin(settings, user):
        raise NotPermitted("forbidden", "this user is not an admin")
    return user


async def change_user_admin(session: AsyncSession, user: DbUser, admin: bool) -> None:
    """Set the user's admin flag (committed)."""
    user.is_admin = admin
    session.add(user)
    await session.commit()
