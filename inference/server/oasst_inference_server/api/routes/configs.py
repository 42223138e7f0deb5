"""The model and plugin configs the original web frontend reads (``/configs/...``)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import Field

from oasst_inference_server.api.deps import RegistryDep
from oasst_shared.schemas import ModelConfigInfo, PluginEntry

router = APIRouter(prefix="/configs", tags=["configs"])


class FleetModelConfigInfo(ModelConfigInfo):
    """A model config as the frontend lists it, with what the fleet has of it (fields added to the
    original server's; its clients ignore them)."""

    loaded: bool = Field(
        True, description="A worker has it loaded; false: a request waits while one loads it"
    )
    loadable_worker_count: int = Field(0, description="Connected workers that can load it")
    quantization: str = Field("none", description="The weights' type (the model config's `quantization`)")


@router.get("/model_configs", response_model=list[FleetModelConfigInfo])
async def model_configs(registry: RegistryDep) -> list[FleetModelConfigInfo]:
    """The models connected workers serve right now or can load (a request for one loads it)."""
    live = await registry.fleet_models()
    return [
        FleetModelConfigInfo(
            name=m.config.name,
            model_id=m.config.model_id,
            description=m.config.description,
            max_input_length=m.config.max_input_length,
            max_total_length=m.config.max_total_length,
            kind=m.config.kind,
            parameter_configs=m.config.parameter_configs,
            worker_count=m.worker_count,
            loaded=m.loaded,
            loadable_worker_count=m.loadable_count,
            quantization=m.config.quantization,
        )
        for m in sorted(live.values(), key=lambda m: m.config.name)
    ]


@router.get("/builtin_plugins", response_model=list[PluginEntry])
async def builtin_plugins() -> list[PluginEntry]:
    """The original system's built-in plugins: none here (tools are OpenAI tool calls)."""
    return []


@router.post("/plugin_config", response_model=PluginEntry)
async def plugin_config(plugin: PluginEntry) -> PluginEntry:
    """The original system fetched the plugin's ``ai-plugin.json`` from its URL. This server runs no
    plugins and fetches nothing (a server-side fetch of a caller's URL is a request forgery risk): the
    entry comes back disabled, without a config."""
    return PluginEntry(url=plugin.url, enabled=False, plugin_config=None, trusted=False)
