"""The admin API of model aliases (behind the admin token, as ``admin``): list them, point one at a model
config with its fallbacks, remove one. A change acts on every replica at once (``routing.alias_table``)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from oasst_inference_server.api.deps import AliasAdminDep
from oasst_inference_server.api.responses import ADMIN, error
from oasst_inference_server.api.routes.admin import require_admin
from oasst_shared.model_routes import AliasList, AliasRead, ModelRoute

router = APIRouter(
    prefix="/admin/aliases", tags=["admin"], dependencies=[Depends(require_admin)], responses=ADMIN
)


@router.get("", response_model=AliasList)
async def list_aliases(aliases: AliasAdminDep) -> AliasList:
    """Every alias (set here, or declared in a model-config file) and the files' fallbacks of each config."""
    return await aliases.list()


@router.put(
    "/{alias}",
    response_model=AliasRead,
    responses={
        400: error("Invalid alias name, an alias of an alias, or invalid fallbacks"),
        404: error("No such model config"),
        409: error("The alias is a model config's name, or too many aliases"),
    },
)
async def set_alias(alias: str, body: ModelRoute, aliases: AliasAdminDep) -> AliasRead:
    """Point ``alias`` at a model config, with the configs that serve in order when it cannot (none: the
    config's own fallbacks from its file). Replaces the alias if it exists."""
    return await aliases.set(alias, body)


@router.delete(
    "/{alias}",
    status_code=204,
    responses={404: error("No such alias"), 409: error("The alias is declared in a model-config file")},
)
async def delete_alias(alias: str, aliases: AliasAdminDep) -> Response:
    await aliases.delete(alias)
    return Response(status_code=204)
