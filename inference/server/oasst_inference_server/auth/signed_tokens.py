"""Signed bearer tokens (JWT, HS256) for users."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Literal

import jwt

from oasst_inference_server.domain_errors import NotAuthenticated
from oasst_inference_server.settings import Settings

TokenKind = Literal["access", "refresh"]
_ALGORITHM = "HS256"


def create_token(settings: Settings, user_id: str, kind: TokenKind, generation: int = 0) -> str:
    now = datetime.now(timezone.utc)
    lifetime = (
        timedelta(minutes=settings.access_token_expire_minutes)
        if kind == "access"
        else timedelta(days=settings.refresh_token_expire_days)
    )
    claims = {
        "sub": user_id,
        "kind": kind,
        "gen": generation,  # the user's token generation: revoking the user's tokens increments it
        "iat": now,
        "exp": now + lifetime,
        "jti": uuid.uuid4().hex,
    }
    return jwt.encode(claims, settings.auth_secret, algorithm=_ALGORITHM)


def verify_token(settings: Settings, token: str, kind: TokenKind) -> tuple[str, int]:
    """Return the user id and token generation of a valid token of ``kind``; raise
    ``NotAuthenticated`` otherwise. (The caller compares the generation with the user's.)"""
    try:
        claims = jwt.decode(
            token, settings.auth_secret, algorithms=[_ALGORITHM], options={"require": ["exp"]}
        )
    except jwt.ExpiredSignatureError:
        raise NotAuthenticated("token_expired", "token expired", bearer=True) from None
    except jwt.InvalidTokenError:
        raise NotAuthenticated("invalid_token", "invalid token", bearer=True) from None
    generation = claims.get("gen", 0)
    if claims.get("kind") != kind or not isinstance(claims.get("sub"), str) or type(generation) is not int:
        raise NotAuthenticated("invalid_token", "invalid token", bearer=True)
    return str(claims["sub"]), generation
