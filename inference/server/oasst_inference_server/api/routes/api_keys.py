"""A user's API keys for the OpenAI-compatible API: create (the key is shown once), list, revoke.

Managing keys needs the user's access token; a key cannot create or revoke keys.
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from oasst_inference_server.api.deps import SessionDep, SettingsDep, SignedInUser
from oasst_inference_server.api.responses import AUTH, error
from oasst_inference_server.auth.api_key_store import (
    count_active_api_keys,
    create_api_key,
    list_api_keys,
    revoke_api_key,
)
from oasst_inference_server.db.models import DbApiKey
from oasst_inference_server.domain_errors import Conflict, not_found
from oasst_shared.schemas import (
    ApiKeyCreated,
    ApiKeyRead,
    CreateApiKeyRequest,
    ListApiKeysResponse,
)

router = APIRouter(prefix="/api_keys", tags=["api keys"])


def to_api_key_read(row: DbApiKey) -> ApiKeyRead:
    return ApiKeyRead(
        id=row.id,
        name=row.name,
        prefix=row.prefix,
        created_at=row.created_at,
        last_used_at=row.last_used_at,
        revoked_at=row.revoked_at,
    )


@router.post(
    "",
    response_model=ApiKeyCreated,
    status_code=201,
    responses={**AUTH, 409: error("Too many active keys")},
)
async def create_key(
    body: CreateApiKeyRequest, user: SignedInUser, session: SessionDep, settings: SettingsDep
) -> ApiKeyCreated:
    """Create a key. The response carries the key itself, once: only its hash is stored."""
    active = await count_active_api_keys(session, user)
    if active >= settings.max_api_keys_per_user:
        raise Conflict(
            "too_many_api_keys",
            f"at most {settings.max_api_keys_per_user} active keys: revoke one first",
        )
    row, key = await create_api_key(session, user, body.name.strip() or "key")
    return ApiKeyCreated(**to_api_key_read(row).model_dump(), key=key)


@router.get("", response_model=ListApiKeysResponse, responses=AUTH)
async def list_keys(user: SignedInUser, session: SessionDep) -> ListApiKeysResponse:
    """The user's keys, newest first, revoked ones included (their usage stays theirs)."""
    rows = await list_api_keys(session, user)
    return ListApiKeysResponse(api_keys=[to_api_key_read(r) for r in rows])


@router.delete(
    "/{key_id}",
    status_code=204,
    responses={**AUTH, 404: error("No such key for this user")},
)
async def revoke_key(key_id: str, user: SignedInUser, session: SessionDep) -> Response:
    """Revoke a key at once; requests with it get 401 from now on."""
    if not await revoke_api_key(session, user, key_id):
        raise not_found("api_key")
    return Response(status_code=204)
