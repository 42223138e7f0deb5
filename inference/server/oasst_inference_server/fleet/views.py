"""What the admin API shows of the fleet (``GET /admin/fleet``) and the bodies of its moves: per worker
session, what it serves, whether it is loaded, what it can load, the switch it is making with its last
progress and how its last one ended; per model, the workers that have it, can load it or are loading it,
and what waits in its queue."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from oasst_inference_server import events
from oasst_inference_server.broker import Broker, BrokerError, WorkerSession
from oasst_inference_server.broker.worker_session import (
    MAX_REASON_CHARS,
    ServableSummary,
    SwitchOutcome,
    SwitchState,
)
from oasst_shared.model_configs import MODEL_NAME_PATTERN


class FleetWorker(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    session_id: str
    worker_id: str | None = None
    worker_name: str | None = None
    model_config_name: str = Field(description="The model it serves (or, unloaded, last served).")
    loaded: bool = Field(description="False: its backend holds no model.")
    switchable: bool = Field(description="It may be told to load or unload (protocol 6).")
    servable: list[ServableSummary] = Field(description="What it can load (that its key allows).")
    switch: SwitchState | None = Field(None, description="The switch it is making, with its last progress.")
    last_switch: SwitchOutcome | None = None
    in_flight: int = 0
    idle_since: float | None = None
    draining: bool = False


class FleetModel(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    name: str
    quantization: str | None = Field(None, description="As the workers' configs say (the first one found).")
    loaded_workers: int = Field(0, description="Workers that have it loaded.")
    loadable_workers: int = Field(0, description="Workers that can load it and have not.")
    loading_workers: int = Field(0, description="Workers told to load it that have not finished.")
    queued: int | None = Field(None, description="Hints in its work queue (null if the broker did not say).")
    keep_alive: float | None = Field(
        None, description="Seconds an idle worker keeps it loaded (null: always)."
    )


class FleetView(BaseModel):
    workers: list[FleetWorker]
    models: list[FleetModel]


class FleetMove(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    session_id: str = Field(min_length=1, max_length=64, description="The worker session to move.")
    model_config_name: str = Field(
        min_length=1, max_length=128, pattern=MODEL_NAME_PATTERN, description="A model it lists as servable."
    )
    reason: str = Field("admin", max_length=MAX_REASON_CHARS, description="Logged and shown with the switch.")


class FleetUnload(BaseModel):
    session_id: str = Field(min_length=1, max_length=64, description="The worker session to unload.")
    reason: str = Field("admin", max_length=MAX_REASON_CHARS)


class FleetCommandAccepted(BaseModel):
    """The worker's replica sent the command; follow the switch in ``GET /admin/fleet``."""

    model_config = ConfigDict(protected_namespaces=())

    session_id: str
    action: str
    model_config_name: str | None = None


async def fleet_view(
    broker: Broker, sessions: Mapping[str, WorkerSession], owners: Mapping[str, tuple[str, str | None]]
) -> FleetView:
    """``owners``: session id -> (registered worker id, its name), for the sessions of registered keys."""
    workers: list[FleetWorker] = []
    models: dict[str, FleetModel] = {}

    def model(name: str) -> FleetModel:
        return models.setdefault(name, FleetModel(name=name))

    for session_id, session in sorted(sessions.items()):
        owner = owners.get(session_id)
        current = session.model_config_
        workers.append(
            FleetWorker(
                session_id=session_id,
                worker_id=owner[0] if owner else None,
                worker_name=owner[1] if owner else None,
                model_config_name=current.name,
                loaded=session.loaded,
                switchable=session.switchable,
                servable=session.servable,
                switch=session.switch,
                last_switch=session.last_switch,
                in_flight=len(session.in_flight),
                idle_since=session.idle_since,
                draining=session.draining,
            )
        )
        if session.loaded:
            entry = model(current.name)
            entry.loaded_workers += 1
            entry.quantization = entry.quantization or current.quantization
            entry.keep_alive = current.keep_alive
        for servable in session.servable if session.switchable else []:
            entry = model(servable.name)
            entry.quantization = entry.quantization or servable.quantization
            if not (session.loaded and servable.name == current.name):
                entry.loadable_workers += 1
        if session.switch is not None and session.switch.model_config_name is not None:
            model(session.switch.model_config_name).loading_workers += 1
    for entry in models.values():
        try:
            entry.queued = await broker.queue_length(events.work_queue_name(entry.name))
        except BrokerError:
            entry.queued = None
    return FleetView(workers=workers, models=sorted(models.values(), key=lambda m: m.name))
