"""The moderation hook's flags for admins: ``GET /admin/moderation/flags``, newest first, a page at a time."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from oasst_inference_server.api.deps import ModerationDep
from oasst_inference_server.api.moments import Moment
from oasst_inference_server.api.responses import ADMIN
from oasst_inference_server.api.routes.admin import require_admin
from oasst_inference_server.moderation.flags import ModerationFlagRead

router = APIRouter(
    prefix="/admin/moderation", tags=["admin"], dependencies=[Depends(require_admin)], responses=ADMIN
)


@router.get("/flags", response_model=list[ModerationFlagRead])
async def list_flags(
    moderation: ModerationDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    before: Annotated[
        Moment | None, Query(description="Only flags created before this (the last `created_at` of a page)")
    ] = None,
) -> list[ModerationFlagRead]:
    """Flagged prompts and answers, newest first: what was found (check, categories, an excerpt) and done."""
    return await moderation.flags.page(limit, before)
