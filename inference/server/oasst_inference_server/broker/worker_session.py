"""What the broker holds about one worker socket: :class:`WorkerSession`, the data of a
:class:`~.base.WorkerSessionRecord`.

The replica holding the socket writes it (when the worker connects, drains or reports capacity) with a
TTL refreshed by the worker's pongs (a pong writes it only when it changed or has lived half its TTL); every replica reads it: which models are live and what their
workers can do (``scheduling.worker_registry``), estimated waits and the queue view, the admin API, a
worker key's open sockets. A record this version cannot read is skipped by those that need its data.

Protocol 6 adds what the fleet's model switches need (``fleet``): the model configs the worker can switch
to (:class:`ServableSummary`, a bounded summary of each, not the whole config: the record is written at
every change of capacity), whether its backend holds a model, the switch it is making
(:class:`SwitchState`, with its last progress) and the outcome of its last one (:class:`SwitchOutcome`),
and since when it has been idle.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from oasst_inference_server.broker.base import WorkerSessionRecord
from oasst_shared.model_configs import Dtype, ModelConfig, ModelKind, Quantization
from oasst_shared.protocol import ServableModel, WorkerCapabilities

# The most characters of a servable config's description and of a switch's error a record keeps.
_MAX_DESCRIPTION_CHARS = 256
MAX_SWITCH_ERROR_CHARS = 500
MAX_REASON_CHARS = 200


class ServableSummary(BaseModel):
    """A model config a worker can switch to, as its session record carries it: enough to list the model,
    admit a request for it before it is loaded and choose the worker to load it; not its chat template,
    presets or backend arguments."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    name: str = Field(description="The model config's name.")
    model_id: str = Field(description="What the backend loads.")
    kind: ModelKind = "generation"
    description: str = ""
    quantization: Quantization = "none"
    dtype: Dtype = "auto"
    backend: str = "cpu"
    max_input_length: int = 1536
    max_total_length: int = 2048
    keep_alive: float | None = None
    memory_bytes: int | None = Field(None, description="Memory the loaded model takes there, where known.")
    load_seconds: float | None = Field(None, description="Its last load there (quantizing included).")

    @classmethod
    def of(cls, servable: ServableModel) -> ServableSummary:
        config = servable.config
        return cls(
            name=config.name,
            model_id=config.model_id[:256],
            kind=config.kind,
            description=config.description[:_MAX_DESCRIPTION_CHARS],
            quantization=config.quantization,
            dtype=config.dtype,
            backend=config.backend,
            max_input_length=config.max_input_length,
            max_total_length=config.max_total_length,
            keep_alive=config.keep_alive,
            memory_bytes=servable.memory_bytes,
            load_seconds=servable.load_seconds,
        )

    def config(self) -> ModelConfig | None:
        """The model config rebuilt from the summary (None if it does not validate: a newer worker's)."""
        try:
            return ModelConfig.model_validate(
                self.model_dump(exclude={"memory_bytes", "load_seconds"}, exclude_none=True)
            )
        except ValidationError:
            return None


class SwitchState(BaseModel):
    """A switch the server asked for and the worker has not finished (no new ``worker_info`` yet)."""

    request_id: str = Field(description="The `request_id` of the `load_model` or `unload_model`.")
    action: Literal["load", "unload"]
    model_config_name: str | None = Field(None, description="The model to load; null for an unload.")
    from_model: str = Field(description="The model the worker served when it was told to switch.")
    reason: str = Field("", description="Why: `on_demand`, `keep_alive`, `admin`, the rebalancer's reason.")
    started_at: float = Field(description="When the command was sent (Unix time).")
    step: str | None = Field(None, description="The last `model_switch` step the worker reported.")
    tensors_done: int | None = None
    tensors_total: int | None = None
    error: str | None = None


class SwitchOutcome(BaseModel):
    """How a worker's last switch ended."""

    action: Literal["load", "unload"]
    model_config_name: str | None = Field(None, description="The model asked for; null for an unload.")
    outcome: Literal["ready", "failed", "unloaded"]
    seconds: float = Field(description="From the command to the worker's new `worker_info`.")
    finished_at: float = Field(description="Unix time.")
    error: str | None = None


class WorkerSession(BaseModel):
    # Fields a newer replica adds are ignored by an older one, and those an older one lacks have defaults,
    # so replicas of two versions read each other's records during a rolling upgrade.
    model_config = ConfigDict(extra="ignore", populate_by_name=True, protected_namespaces=())

    model_config_: ModelConfig = Field(alias="model_config", description="The model the worker serves.")
    max_parallel_requests: int = Field(description="Jobs the worker declared it runs at once.")
    free_slots: int = Field(0, description="Jobs it can take now, as the server counts them.")
    in_flight: list[str] = Field(default_factory=list, description="The messages it holds.")
    backend_kind: str = Field(description="The kind of backend it relays to.")
    backend_healthy: bool = Field(True, description="Whether its backend answered its last health check.")
    draining: bool = Field(False, description="Finishing its in-flight work, taking no new work.")
    worker_version: str = Field("unknown", description="The worker package's version.")
    capabilities: WorkerCapabilities = Field(
        default_factory=WorkerCapabilities, description="What its backend can honour."
    )
    connected_at: float = Field(description="When the socket opened (Unix time).")
    worker_id: str | None = Field(None, description="The registered worker whose key it used, if any.")
    kv_cache_free_tokens: int | None = Field(
        None, description="Free KV-cache tokens, where the backend tells."
    )
    backend_queue_length: int | None = Field(None, description="Requests waiting in the backend, where told.")
    tokens_per_second: float | None = Field(None, description="Per request, as measured by the server.")
    backend_model_id: str | None = Field(None, description="The model its backend says it serves.")
    backend_model_revision: str | None = Field(
        None, description="The model's revision or file hash, where the backend tells."
    )
    backend_version: str | None = Field(None, description="The backend's build, where it tells.")
    trusted: bool = Field(False, description="Whether its key is trusted (compliance checks spare it).")
    flagged: bool = Field(False, description="Its key failed compliance checks: it gets no user work.")
    # Protocol 6 (older replicas ignore these; records of older ones read as a loaded, fixed worker).
    switchable: bool = Field(False, description="It may be told to load or unload (protocol 6, servable).")
    servable: list[ServableSummary] = Field(
        default_factory=list, description="The model configs it can switch to that its key allows."
    )
    loaded: bool = Field(True, description="False: its backend holds no model; it serves nothing now.")
    switch: SwitchState | None = Field(None, description="The switch it is making, if any.")
    last_switch: SwitchOutcome | None = Field(None, description="How its last switch ended.")
    idle_since: float | None = Field(None, description="Since when it holds no work (Unix time).")

    @property
    def serves(self) -> str | None:
        """The model it takes work for when it has room: loaded and not switching; None otherwise."""
        return self.model_config_.name if self.loaded and self.switch is None else None

    def can_load(self, model: str) -> bool:
        return self.switchable and any(s.name == model for s in self.servable)

    def record(self, session_id: str) -> WorkerSessionRecord:
        return WorkerSessionRecord(session_id, self.model_config_.name, self.model_dump_json(by_alias=True))

    @classmethod
    def of(cls, record: WorkerSessionRecord) -> WorkerSession | None:
        """The session a record holds; None if this version cannot read it."""
        try:
            return cls.model_validate_json(record.data)
        except ValidationError:
            return None
