from __future__ import annotations

from fastapi import APIRouter

from oasst_inference_server.api.deps import RegistryDep
from oasst_shared.schemas import ModelConfigInfo

router = APIRouter(prefix="/configs", tags=["configs"])


@router.get("/model_configs", response_model=list[ModelConfigInfo])
async def model_configs(registry: RegistryDep) -> list[ModelConfigInfo]:
    """The models that at least one connected worker serves right now."""
    live = await registry.live_models()
    return [
        ModelConfigInfo(
            name=m.config.name,
            model_id=m.config.model_id,
            description=m.config.description,
            max_input_length=m.config.max_input_length,
            max_total_length=m.config.max_total_length,
            kind=m.config.kind,
            parameter_configs=m.config.parameter_configs,
            worker_count=m.worker_count,
        )
        for m in sorted(live.values(), key=lambda m: m.config.name)
    ]
