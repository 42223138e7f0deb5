"""What the broker holds about one worker socket: :class:`WorkerSession`, the data of a
:class:`~.base.WorkerSessionRecord`.

The replica holding the socket writes it (when the worker connects, drains or reports capacity) with a
TTL refreshed by the worker's pongs; every replica reads it: which models are live and what their
workers can do (``dispatch.worker_registry``), estimated waits and the queue view, the admin API, a
worker key's open sockets. A record this version cannot read is skipped by those that need its data.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from oasst_inference_server.broker.base import WorkerSessionRecord
from oasst_shared.model_configs import ModelConfig
from oasst_shared.protocol import WorkerCapabilities


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

    def record(self, session_id: str) -> WorkerSessionRecord:
        return WorkerSessionRecord(session_id, self.model_config_.name, self.model_dump_json(by_alias=True))

    @classmethod
    def of(cls, record: WorkerSessionRecord) -> WorkerSession | None:
        """The session a record holds; None if this version cannot read it."""
        try:
            return cls.model_validate_json(record.data)
        except ValidationError:
            return None
