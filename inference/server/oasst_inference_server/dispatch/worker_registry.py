"""Which workers are connected, on any replica: their sessions as the broker holds them."""

from __future__ import annotations

from dataclasses import dataclass, field

from oasst_inference_server.broker import Broker, WorkerSession
from oasst_shared.model_configs import MODEL_CONFIGS, ModelConfig
from oasst_shared.protocol import WorkerCapabilities


@dataclass
class LiveModel:
    config: ModelConfig
    worker_count: int = 0
    free_slots: int = 0
    # What every connected worker of the model can do: any of them may take a request.
    capabilities: WorkerCapabilities = field(default_factory=WorkerCapabilities)


@dataclass
class WorkerRegistry:
    broker: Broker

    async def live_models(self) -> dict[str, LiveModel]:
        """Models with at least one connected worker on any replica."""
        models: dict[str, LiveModel] = {}
        capabilities: dict[str, list[WorkerCapabilities]] = {}
        for record in await self.broker.list_worker_sessions():
            session = WorkerSession.of(record)
            if session is None:
                continue
            config = session.model_config_
            live = models.setdefault(config.name, LiveModel(config=config))
            live.worker_count += 1
            live.free_slots += session.free_slots
            capabilities.setdefault(config.name, []).append(session.capabilities)
        for name, each in capabilities.items():
            models[name].capabilities = WorkerCapabilities.common(each)
        return models

    @staticmethod
    def known_model_names(live: dict[str, LiveModel]) -> list[str]:
        return sorted(set(live) | set(MODEL_CONFIGS))
