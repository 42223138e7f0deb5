"""Which workers are connected, on any replica: their sessions as the broker holds them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from oasst_inference_server.broker import Broker, WorkerSession
from oasst_inference_server.broker.session_view import DEFAULT_MAX_AGE, SessionSnapshot, WorkerSessionView
from oasst_shared.model_configs import MODEL_CONFIGS, ModelConfig
from oasst_shared.protocol import WorkerCapabilities


@dataclass
class LiveModel:
    config: ModelConfig
    worker_count: int = 0
    free_slots: int = 0
    # What every connected worker of the model can do: any of them may take a request.
    capabilities: WorkerCapabilities = field(default_factory=WorkerCapabilities)


class WorkerRegistry:
    """The live models as this process last read the worker sessions (:mod:`..broker.session_view`):
    read at most once per ``max_age`` seconds however many requests ask, and at once after a worker of
    this process connected or left."""

    def __init__(
        self,
        broker: Broker,
        max_age: float = DEFAULT_MAX_AGE,
        known: Mapping[str, ModelConfig] = MODEL_CONFIGS,
    ):
        self.broker = broker
        self._known = known  # the model registry: models that exist whether or not a worker serves them
        self.sessions = WorkerSessionView(broker, max_age)
        self._models: tuple[SessionSnapshot, dict[str, LiveModel]] | None = None

    async def live_models(self, wanted: str | None = None) -> dict[str, LiveModel]:
        """Models with at least one connected worker on any replica. If ``wanted`` is not among them,
        the sessions are read afresh first: no request is told that no worker serves its model because
        of a view up to ``max_age`` old."""
        models = await self._live_models(fresh=False)
        if wanted is not None and wanted not in models:
            models = await self._live_models(fresh=True)
        return models

    async def _live_models(self, *, fresh: bool) -> dict[str, LiveModel]:
        snapshot = await self.sessions.snapshot(fresh=fresh)
        if self._models is None or self._models[0] is not snapshot:
            self._models = (snapshot, _live_models(snapshot.sessions.values()))
        return dict(self._models[1])  # the caller's own dict; the LiveModel objects are shared

    def known_model_names(self, live: dict[str, LiveModel]) -> list[str]:
        return sorted(set(live) | set(self._known))


def _live_models(sessions: Iterable[WorkerSession]) -> dict[str, LiveModel]:
    models: dict[str, LiveModel] = {}
    capabilities: dict[str, list[WorkerCapabilities]] = {}
    for session in sessions:
        config = session.model_config_
        live = models.setdefault(config.name, LiveModel(config=config))
        live.worker_count += 1
        live.free_slots += session.free_slots
        capabilities.setdefault(config.name, []).append(session.capabilities)
    for name, each in capabilities.items():
        models[name].capabilities = WorkerCapabilities.common(each)
    return models
