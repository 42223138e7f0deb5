"""Which workers are connected, on any replica, and the models they serve or can load: their sessions
as the broker holds them.

A model is *live* while a worker has it loaded (a worker told to switch away counts until it has); it is
*loadable* while a connected worker can switch to it (protocol 6: it lists the model as servable) and
none has it loaded. The fleet's models are both: what ``/v1/models`` lists, what a request may ask for
(a loadable one waits in the queue while a worker loads it: ``fleet.on_demand``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from oasst_inference_server.broker import Broker, WorkerSession
from oasst_inference_server.broker.session_view import DEFAULT_MAX_AGE, SessionSnapshot, WorkerSessionView
from oasst_shared.model_configs import MODEL_CONFIGS, ModelConfig
from oasst_shared.protocol import WorkerCapabilities


@dataclass
class LiveModel:
    config: ModelConfig
    # Workers that have it loaded (one that was told to switch away counts until its new worker_info).
    worker_count: int = 0
    free_slots: int = 0
    # What every worker that has it loaded can do (any of them may take a request); for a model nobody
    # has loaded, what every worker that can load it can do with the model it has now.
    capabilities: WorkerCapabilities = field(default_factory=WorkerCapabilities)
    # Connected workers that can switch to it (protocol 6) and have not loaded it.
    loadable_count: int = 0
    # Workers told to load it that have not finished.
    loading_count: int = 0

    @property
    def loaded(self) -> bool:
        return self.worker_count > 0


@dataclass(frozen=True)
class _Models:
    snapshot: SessionSnapshot
    live: dict[str, LiveModel]  # loaded somewhere
    fleet: dict[str, LiveModel]  # loaded somewhere or loadable


class WorkerRegistry:
    """The live models as this process last read the worker sessions (:mod:`..broker.session_view`):
    read at most once per ``max_age`` seconds however many requests ask, and at once after a worker of
    this process connected, left or switched its model."""

    def __init__(
        self,
        broker: Broker,
        max_age: float = DEFAULT_MAX_AGE,
        known: Mapping[str, ModelConfig] = MODEL_CONFIGS,
        *,
        on_demand: bool = True,
    ):
        self.broker = broker
        # settings.on_demand_loading: off, a model nobody has loaded is not one of the fleet's.
        self.on_demand = on_demand
        self._known = known  # the model registry: models that exist whether or not a worker serves them
        self.sessions = WorkerSessionView(broker, max_age)
        self._models: _Models | None = None

    async def live_models(self, wanted: str | None = None) -> dict[str, LiveModel]:
        """Models with at least one connected worker that has them loaded, on any replica. If ``wanted`` is
        not among them, the sessions are read afresh first: no request is told that no worker serves its
        model because of a view up to ``max_age`` old."""
        models = await self._read(fresh=False)
        if wanted is not None and wanted not in models.live:
            models = await self._read(fresh=True)
        return dict(models.live)  # the caller's own dict; the LiveModel objects are shared

    async def fleet_models(self, wanted: str | None = None) -> dict[str, LiveModel]:
        """The live models and the loadable ones (``loaded`` false, ``loadable_count`` > 0; only with
        ``on_demand``), read afresh if ``wanted`` is among neither."""
        models = await self._read(fresh=False)
        listed = models.fleet if self.on_demand else models.live
        if wanted is not None and wanted not in listed:
            models = await self._read(fresh=True)
        return dict(models.fleet if self.on_demand else models.live)

    async def model(self, name: str) -> LiveModel | None:
        """The model ``name`` if a worker has it loaded, else if a worker can load it (and ``on_demand``),
        else None."""
        models = await self._read(fresh=False)
        if name not in models.live:
            models = await self._read(fresh=True)
        return models.live.get(name) or (models.fleet.get(name) if self.on_demand else None)

    async def fleet_configs(self) -> dict[str, ModelConfig]:
        """The configs of the models workers serve or can load (whatever ``on_demand`` says), by name."""
        return {name: model.config for name, model in (await self._read(fresh=True)).fleet.items()}

    def known_model_names(self, live: dict[str, LiveModel]) -> list[str]:
        return sorted(set(live) | set(self._known))

    async def _read(self, *, fresh: bool) -> _Models:
        snapshot = await self.sessions.snapshot(fresh=fresh)
        if self._models is None or self._models.snapshot is not snapshot:
            live = _live_models(snapshot.sessions.values())
            fleet = {**_loadable_models(snapshot.sessions.values(), live, self._known), **live}
            self._models = _Models(snapshot, live, fleet)
        return self._models


def _live_models(sessions: Collection[WorkerSession]) -> dict[str, LiveModel]:
    models: dict[str, LiveModel] = {}
    capabilities: dict[str, list[WorkerCapabilities]] = {}
    for session in sessions:
        if not session.loaded:
            continue  # its backend holds no model: it serves none
        config = session.model_config_
        live = models.setdefault(config.name, LiveModel(config=config))
        live.worker_count += 1
        live.free_slots += session.free_slots
        capabilities.setdefault(config.name, []).append(session.capabilities)
    for name, each in capabilities.items():
        models[name].capabilities = WorkerCapabilities.common(each)
    _count_switches(sessions, models)
    return models


def _loadable_models(
    sessions: Collection[WorkerSession], live: Mapping[str, LiveModel], known: Mapping[str, ModelConfig]
) -> dict[str, LiveModel]:
    """The models connected workers can load and none has loaded, each with the config the server's
    registry has for it (else the one the first worker listing it summarises)."""
    models: dict[str, LiveModel] = {}
    capabilities: dict[str, list[WorkerCapabilities]] = {}
    for session in sessions:
        if not session.switchable or session.flagged:
            continue
        for servable in session.servable:
            name = servable.name
            if name in live or (session.loaded and name == session.model_config_.name):
                continue
            model = models.get(name)
            if model is None:
                config = known.get(name) or servable.config()
                if config is None:
                    continue
                model = models[name] = LiveModel(config=config)
            model.loadable_count += 1
            capabilities.setdefault(name, []).append(session.capabilities)
    for name, each in capabilities.items():
        models[name].capabilities = WorkerCapabilities.common(each)
    _count_switches(sessions, models)
    return models


def _count_switches(sessions: Collection[WorkerSession], models: Mapping[str, LiveModel]) -> None:
    for session in sessions:
        target = session.switch.model_config_name if session.switch is not None else None
        if target is not None and target in models:
            models[target].loading_count += 1
