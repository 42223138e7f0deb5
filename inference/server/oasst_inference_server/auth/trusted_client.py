"""Trusted-client auth: a web frontend signs its users in with the ``TrustedClient`` header.

The format is the original Open-Assistant inference server's, so its web frontend works unchanged:
the header is base64-encoded JSON ``{"api_key", "client", "user_id", "provider_account_id",
"username"}``. ``api_key`` must be one of ``settings.trusted_client_api_keys``; ``user_id`` is the
user's id at the frontend and becomes (or finds) the user's id here, with ``client`` as its provider.

Each key is bound to one client name (``settings.trusted_client_api_keys`` entries are
``NAME:KEY``): the header's ``client`` must be that name, and the key acts only for users it
created, whose provider is ``trusted:NAME`` (``trusted_client_names.py``). A user id of another
provider (a GitHub, Discord or debug login, another frontend) is refused, so one frontend's key
cannot reach another's users, whatever client name it claims.
"""

from __future__ import annotations

import base64
import binascii
import hmac

from loguru import logger
from pydantic import BaseModel, Field, ValidationError
from sqlalchemy.exc import IntegrityError
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.db.models import DbUser
from oasst_inference_server.domain_errors import Conflict, NotAuthenticated
from oasst_inference_server.settings import Settings
from oasst_inference_server.trusted_client_names import trusted_provider
from oasst_shared.json_depth import json_depth

TRUSTED_CLIENT_HEADER = "TrustedClient"


class TrustedClient(BaseModel):
    api_key: str = Field(min_length=1, max_length=512)
    client: str = Field(min_length=1, max_length=32)  # "website", "discord", ...
    user_id: str = Field(min_length=1, max_length=36)  # the user's id in the frontend's backend
    provider_account_id: str = Field(min_length=1, max_length=128)  # the user's id at the client
    username: str = Field(min_length=1, max_length=256)


def encode_trusted_client(info: TrustedClient) -> str:
    """The header value a frontend sends (used by tests and tools)."""
    return base64.b64encode(info.model_dump_json().encode()).decode()


# The base64 of the largest header the model allows (every field at its longest, its JSON escapes
# included), rounded up: anything longer is refused before it is decoded.
MAX_TRUSTED_CLIENT_HEADER = 8192


def parse_trusted_client(header: str) -> TrustedClient:
    invalid = NotAuthenticated(
        "invalid_trusted_client", "the TrustedClient header is not base64 JSON of the expected shape"
    )
    if len(header) > MAX_TRUSTED_CLIENT_HEADER:
        raise invalid
    try:
        raw = base64.b64decode(header.strip(), validate=False)
    except (binascii.Error, ValueError):
        raise invalid from None
    # One flat object: anything nested is refused before a parser meets it.
    if json_depth(raw) > 1:
        raise invalid
    try:
        return TrustedClient.model_validate_json(raw)
    except ValidationError:
        raise invalid from None


def _client_of_key(settings: Settings, api_key: str) -> str | None:
    """The client name the key is bound to (every key is compared, in constant time each)."""
    found = None
    for name, key in settings.trusted_client_keys().items():
        if hmac.compare_digest(api_key.encode(), key.encode()):
            found = name
    return found


def is_trusted_header(settings: Settings, header: str) -> bool:
    """Whether a TrustedClient header carries one of the trusted keys (it is not a sign-in)."""
    try:
        return _client_of_key(settings, parse_trusted_client(header).api_key) is not None
    except NotAuthenticated:
        return False


async def trusted_client_user(session: AsyncSession, settings: Settings, header: str) -> DbUser:
    """The user a trusted client speaks for, created on first sight."""
    info = parse_trusted_client(header)
    client_name = _client_of_key(settings, info.api_key)
    if client_name is None:
        raise NotAuthenticated("unauthorized_client", "unknown trusted-client API key")
    if info.client != client_name:
        raise NotAuthenticated("unauthorized_client", "this key belongs to another trusted client")
    provider = trusted_provider(client_name)
    user = await session.get(DbUser, info.user_id)
    if user is None:
        user = DbUser(
            id=info.user_id,
            provider=provider,
            provider_account_id=info.provider_account_id,
            display_name=info.username,
        )
        session.add(user)
        try:
            await session.commit()
            logger.info("trusted client {} created user {}", client_name, user.id)
        except IntegrityError:
            # Created by a concurrent request, or the account id is taken by another user id.
            await session.rollback()
            found = await session.get(DbUser, info.user_id)
            if found is None:
                raise Conflict(
                    "account_conflict", "this client account is linked to another user id"
                ) from None
            user = found
    if user.deleted:
        raise NotAuthenticated("user_deleted", "this account was deleted")
    if user.provider != provider:
        raise NotAuthenticated("unauthorized_client", "this user was not created by this trusted client")
    if user.display_name != info.username:
        user.display_name = info.username
        session.add(user)
        await session.commit()
    return user
