"""The admin API of usage limits (behind ``settings.admin_root_token``, as :mod:`.admin`): API keys with
their limits and usage, limits of keys and users, usage per key, model and day. Shapes:
``oasst_shared.usage_limits``; docs/operating.md#keys-limits-and-budgets."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query

from oasst_inference_server.api.deps import QuotaGateDep, SessionDep
from oasst_inference_server.api.moments import Moment
from oasst_inference_server.api.responses import ADMIN, error
from oasst_inference_server.api.routes.admin import require_admin
from oasst_inference_server.quotas.admin_views import (
    MAX_KEYS_LISTED,
    list_keys,
    set_key_limits,
    set_user_limits,
    usage_report,
    user_limits,
)
from oasst_shared.usage_limits import AdminKeyRead, UsageLimits, UsageRow, UserLimitsRead

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin)], responses=ADMIN)

Id = Annotated[str, Path(min_length=1, max_length=36)]
OptionalId = Annotated[str | None, Query(min_length=1, max_length=36)]


@router.get("/keys", response_model=list[AdminKeyRead])
async def get_keys(
    session: SessionDep,
    quotas: QuotaGateDep,
    user_id: OptionalId = None,
    limit: Annotated[int, Query(ge=1, le=MAX_KEYS_LISTED)] = MAX_KEYS_LISTED,
) -> list[AdminKeyRead]:
    """Every API key (or one user's), newest first, with its limits and today's and the period's usage."""
    return await list_keys(session, quotas.prices, user_id=user_id, limit=limit)


@router.put("/keys/{key_id}/limits", response_model=AdminKeyRead, responses={404: error("No such key")})
async def put_key_limits(
    key_id: Id, limits: UsageLimits, session: SessionDep, quotas: QuotaGateDep
) -> AdminKeyRead:
    """Replace the key's limits (every field null: no limits); they apply to its next request."""
    return await set_key_limits(session, quotas.prices, key_id, limits)


@router.get("/users/{user_id}/limits", response_model=UserLimitsRead, responses={404: error("No such user")})
async def get_user_limits(user_id: Id, session: SessionDep) -> UserLimitsRead:
    return await user_limits(session, user_id)


@router.put("/users/{user_id}/limits", response_model=UserLimitsRead, responses={404: error("No such user")})
async def put_user_limits(user_id: Id, limits: UsageLimits, session: SessionDep) -> UserLimitsRead:
    """Replace the user's limits: they count every request of the user, with any key or none."""
    return await set_user_limits(session, user_id, limits)


@router.get("/usage", response_model=list[UsageRow])
async def get_usage(
    session: SessionDep,
    quotas: QuotaGateDep,
    key_id: OptionalId = None,
    user_id: OptionalId = None,
    model: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
    since: Moment | None = None,
    until: Moment | None = None,
) -> list[UsageRow]:
    """Requests, tokens and their cost per day (UTC), user, key and model; default the last 30 days, at
    most 366."""
    return await usage_report(
        session, quotas.prices, key_id=key_id, user_id=user_id, model=model, since=since, until=until
    )
