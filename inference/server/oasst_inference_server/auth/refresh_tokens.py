"""Refresh tokens: opaque, stored as SHA-256 hashes, rotated on every use.

A login starts a *family*. Each ``POST /auth/refresh`` marks the presented token used and returns
a new access token with the family's next refresh token. Presenting a used token again means it was
copied (or a client raced itself): the whole family is revoked, so whoever holds its newest token is
signed out too (OAuth 2.0 Security BCP, "refresh token rotation"). The use is one conditional
update, so two replicas refreshing one token concurrently cannot both succeed.

Access tokens are short-lived signed JWTs (``signed_tokens.py``); they are not stored and stop working
when they expire, when the user is deleted, or when the user's tokens are revoked (each names the
user's token generation, which ``revoke_user_tokens`` increments).
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from loguru import logger
from sqlalchemy import ColumnElement, update
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.auth.signed_tokens import create_token
from oasst_inference_server.db.models import DbRefreshToken, DbUser, new_id, utcnow
from oasst_inference_server.domain_errors import NotAuthenticated
from oasst_inference_server.settings import Settings
from oasst_shared.schemas import LoginResponse, TokenPair

REFRESH_TOKEN_PREFIX = "ort_"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _new_refresh_row(settings: Settings, user_id: str, family_id: str) -> tuple[str, DbRefreshToken]:
    token = REFRESH_TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = DbRefreshToken(
        user_id=user_id,
        family_id=family_id,
        token_hash=hash_secret(token),
        expires_at=utcnow() + timedelta(days=settings.refresh_token_expire_days),
    )
    return token, row


def _pair(settings: Settings, user: DbUser, refresh_token: str) -> LoginResponse:
    return LoginResponse(
        access_token=TokenPair(access_token=create_token(settings, user.id, "access", user.token_generation)),
        refresh_token=TokenPair(access_token=refresh_token),
    )


async def login(session: AsyncSession, settings: Settings, user: DbUser) -> LoginResponse:
    """A new access token and the first refresh token of a new family; commits."""
    token, row = _new_refresh_row(settings, user.id, new_id())
    session.add(row)
    await session.commit()
    return _pair(settings, user, token)


async def refresh(session: AsyncSession, settings: Settings, presented: str) -> LoginResponse:
    """Exchange a refresh token for a new access token and the family's next refresh token."""
    row = (
        await session.exec(select(DbRefreshToken).where(DbRefreshToken.token_hash == hash_secret(presented)))
    ).one_or_none()
    if row is None:
        raise NotAuthenticated("invalid_refresh_token", "unknown refresh token", bearer=True)
    if row.revoked_at is not None:
        raise NotAuthenticated(
            "refresh_token_revoked", "this refresh token was revoked: log in again", bearer=True
        )
    user_id, family_id = row.user_id, row.family_id
    if row.used_at is not None:
        await _reuse_detected(session, user_id, family_id)
    now = utcnow()
    if row.expires_at <= now:
        raise NotAuthenticated("refresh_token_expired", "refresh token expired: log in again", bearer=True)
    user = await session.get(DbUser, row.user_id)
    if user is None or user.deleted:
        raise NotAuthenticated("invalid_refresh_token", "unknown user", bearer=True)
    used = await session.exec(
        update(DbRefreshToken)
        .where(
            DbRefreshToken.id == row.id,
            DbRefreshToken.used_at.is_(None),
            DbRefreshToken.revoked_at.is_(None),
        )
        .values(used_at=now)
    )
    if used.rowcount != 1:
        await session.rollback()  # a concurrent refresh used it first
        await _reuse_detected(session, user_id, family_id)
    token, successor = _new_refresh_row(settings, user_id, family_id)
    session.add(successor)
    await session.commit()
    return _pair(settings, user, token)


async def _reuse_detected(session: AsyncSession, user_id: str, family_id: str) -> None:
    revoked = await revoke(session, DbRefreshToken.family_id == family_id)
    logger.warning(
        "refresh token of user {} was reused: revoked its family {} ({} tokens)",
        user_id,
        family_id,
        revoked,
    )
    raise NotAuthenticated(
        "refresh_token_reused",
        "this refresh token was already used: every session of it is signed out",
        bearer=True,
    )


async def revoke_family_of(session: AsyncSession, presented: str) -> int:
    """Log out: revoke the family of a refresh token (unknown tokens are ignored)."""
    family = (
        await session.exec(
            select(DbRefreshToken.family_id).where(DbRefreshToken.token_hash == hash_secret(presented))
        )
    ).one_or_none()
    if family is None:
        return 0
    return await revoke(session, DbRefreshToken.family_id == family)


async def revoke_user_tokens(session: AsyncSession, user_id: str) -> int:
    """Revoke the user's refresh tokens and end the access tokens already issued (the user's token
    generation moves on, and every access token names the generation it was issued in)."""
    await session.exec(
        update(DbUser).where(DbUser.id == user_id).values(token_generation=DbUser.token_generation + 1)
    )
    return await revoke(session, DbRefreshToken.user_id == user_id)


async def revoke(session: AsyncSession, condition: ColumnElement[bool]) -> int:
    """Revoke every unrevoked refresh token matching ``condition``; commits; returns how many."""
    result = await session.exec(
        update(DbRefreshToken)
        .where(condition, DbRefreshToken.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )
    await session.commit()
    return int(result.rowcount)
