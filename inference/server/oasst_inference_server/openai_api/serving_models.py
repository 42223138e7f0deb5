"""``/v1/models``: the models connected workers serve now or can load (on-demand loading), with their
context length, quantization and whether they are loaded."""

from __future__ import annotations

import time

from oasst_inference_server.domain_errors import NotFound
from oasst_inference_server.openai_api.openai_service import OpenAIService
from oasst_inference_server.openai_protocol.models import ModelCard, ModelList
from oasst_inference_server.scheduling.worker_registry import LiveModel

_STARTED = int(time.time())


def _card(model: LiveModel) -> ModelCard:
    return ModelCard(
        id=model.config.name,
        created=_STARTED,
        context_length=model.config.max_total_length,
        max_input_length=model.config.max_input_length,
        kind=model.config.kind,
        worker_count=model.worker_count,
        loaded=model.loaded,
        loadable_worker_count=model.loadable_count,
        quantization=model.config.quantization,
    )


class ModelServing:
    def __init__(self, service: OpenAIService) -> None:
        self.service = service

    async def list(self) -> ModelList:
        live = await self.service.fleet_models()
        return ModelList(data=[_card(m) for _, m in sorted(live.items())])

    async def retrieve(self, name: str) -> ModelCard:
        """The model ``name``: NotFound (naming the available ones) unless a worker serves it now or can
        load it."""
        live = await self.service.fleet_models(wanted=name)
        if name not in live:
            available = ", ".join(sorted(live)) or "none"
            raise NotFound("model_not_found", f"the model {name!r} does not exist; available: {available}")
        return _card(live[name])
