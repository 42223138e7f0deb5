"""Users' API keys: created with 256 random bits, shown once, stored as a SHA-256 hash.

A plain hash (no salt, no slow KDF) is enough for keys this random: nobody can guess one from its
hash, and a lookup by hash stays one indexed query per request.
"""

from __future__ import annotations

import secrets
from datetime import timedelta

from sqlalchemy import func, update
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.auth.refresh_tokens import hash_secret
from oasst_inference_server.db.models import DbApiKey, DbUser, utcnow

API_KEY_PREFIX = "oak-"
_SHOWN_PREFIX_LENGTH = len(API_KEY_PREFIX) + 8
_LAST_USED_RESOLUTION = timedelta(minutes=1)  # write last_used_at at most this often


def generate_api_key() -> str:
    return API_KEY_PREFIX + secrets.token_urlsafe(32)


def is_api_key(token: str) -> bool:
    return token.startswith(API_KEY_PREFIX)


async def create_api_key(session: AsyncSession, user: DbUser, name: str) -> tuple[DbApiKey, str]:
    """A new key for ``user``: the row (committed) and the key itself, which is not stored."""
    key = generate_api_key()
    row = DbApiKey(user_id=user.id, name=name, prefix=key[:_SHOWN_PREFIX_LENGTH], key_hash=hash_secret(key))
    session.add(row)
    await session.commit()
    return row, key


async def authenticate_api_key(session: AsyncSession, key: str) -> tuple[DbUser, DbApiKey] | None:
    """The user and row of a valid, unrevoked key; None otherwise."""
    row = (await session.exec(select(DbApiKey).where(DbApiKey.key_hash == hash_secret(key)))).one_or_none()
    if row is None or row.revoked_at is not None:
        return None
    user = await session.get(DbUser, row.user_id)
    if user is None or user.deleted:
        return None
    now = utcnow()
    if row.last_used_at is None or now - row.last_used_at > _LAST_USED_RESOLUTION:
        await session.exec(update(DbApiKey).where(DbApiKey.id == row.id).values(last_used_at=now))
        await session.commit()
    return user, row


async def count_active_api_keys(session: AsyncSession, user: DbUser) -> int:
    """How many of ``user``'s keys are not revoked."""
    return (
        await session.exec(
            select(func.count()).where(DbApiKey.user_id == user.id, DbApiKey.revoked_at.is_(None))
        )
    ).one()


async def list_api_keys(session: AsyncSession, user: DbUser) -> list[DbApiKey]:
    """``user``'s keys, newest first, revoked ones included."""
    return list(
        (
            await session.exec(
                select(DbApiKey).where(DbApiKey.user_id == user.id).order_by(DbApiKey.created_at.desc())
            )
        ).all()
    )


async def revoke_api_key(session: AsyncSession, user: DbUser, key_id: str) -> bool:
    """Revoke ``user``'s key ``key_id`` (a no-op if already revoked); False if the user has no such key."""
    row = await session.get(DbApiKey, key_id)
    if row is None or row.user_id != user.id:
        return False
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        session.add(row)
        await session.commit()
    return True
