"""Settings sections: models and worker sockets, model switching, dispatch, trusted workers, recovery."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field


class _ModelsAndWorkerSocketsSettings(BaseModel):
    """Settings: models and worker sockets."""

    model_configs_dir: Path | None = Field(
        default=None,
        description="A folder of model configs (YAML or JSON files; docs/models.md) merged over the built-in "
        "ones; the same folder the workers and CPU backends read. Checked at start.",
    )
    worker_api_keys: list[str] = Field(
        default_factory=list,
        description="Worker keys from settings (JSON list, 16+ characters each); development adds "
        "dev-worker-key. Keys created with the admin API need no setting",
    )
    worker_hello_timeout: float = Field(
        default=10.0, gt=0, description="Seconds a new worker connection has to send its `worker_info` frame."
    )
    worker_ping_interval: float = Field(
        default=5.0, gt=0, description="Seconds between pings to each worker."
    )
    worker_ping_timeout: float = Field(
        default=15.0,
        gt=0,
        description="A worker silent this long is disconnected and its messages are retried elsewhere.",
    )
    worker_send_timeout: float = Field(
        default=5.0,
        gt=0,
        description="Seconds a frame to a worker may take to go out (the socket's buffers full: the worker "
        "does not read); past it the worker is disconnected and its messages are retried elsewhere. A job "
        "is sent while its claim's transaction is still open, so this also bounds how long a worker that "
        "does not read can hold a database connection.",
    )
    max_slots_per_worker: int = Field(
        default=256,
        ge=1,
        le=1024,
        description="The most parallel requests one worker socket may announce (a key may allow fewer)",
    )


class _ModelSwitchingSettings(BaseModel):
    """Settings: model switching and on-demand loading."""

    model_switch_timeout: float = Field(
        default=1800.0,
        gt=0,
        le=86_400,
        description="Seconds a worker told to load or unload a model (protocol 6) has to send its new "
        "`worker_info` (draining, quantizing and loading included); past it the worker is disconnected",
    )
    model_switch_reply_timeout: float = Field(
        default=5.0,
        gt=0,
        le=60,
        description="Seconds a load or unload command waits for the replica holding the worker's socket to "
        "say it sent the command (or why not)",
    )
    on_demand_loading: bool = Field(
        default=True,
        description="A request for a model no worker has loaded but some connected worker can load is "
        "queued and a worker is told to load it (docs/models.md); off: such a request is a 503",
    )
    fleet_interval: float = Field(
        default=2.0,
        gt=0,
        description="Seconds between the fleet passes (on one replica at a time): loads for models with "
        "queued work and no worker, unloads of models idle past their `keep_alive`",
    )
    load_retry_backoff: float = Field(
        default=60.0,
        ge=0,
        description="Seconds a worker whose load of a model failed is not asked to load it again on demand",
    )


class _DispatchHandOverLeasesRetriesSettings(BaseModel):
    """Settings: dispatch: hand-over, leases, retries."""

    prompt_count_timeout: float = Field(
        default=2.0,
        gt=0,
        le=30,
        description="Seconds a request waits for a worker of this server process to count its prompt in the "
        "model's tokens, when the prompt is too long for a bound to tell that it fits; past it the request is "
        "admitted unchecked (docs/openai-api.md#prompts-longer-than-the-model-takes)",
    )
    hand_over_at_once: bool = Field(
        default=True,
        description="When nothing waits in a model's queue and a worker of this server process has room, a "
        "new job is sent to it inside the transaction that creates it, before the commit, instead of being "
        "queued: the worker gets it about a disk flush and three hops sooner. The fair queue counts it as "
        "served; a job never jumps one that waits. Off: every job goes through the queue.",
    )
    lease_seconds: float = Field(
        default=30.0,
        gt=0,
        description="A message's lease on its worker, extended by the worker's pongs and results",
    )
    max_attempts: int = Field(default=3, ge=1, description="Tries per message before it fails")
    max_backend_refusals: int = Field(
        default=20,
        ge=0,
        description=(
            "Times a message may be handed back because a worker's backend had no room or was down "
            "without spending an attempt; past it every refusal counts as an attempt"
        ),
    )
    max_backend_deaths: int = Field(
        default=2,
        ge=1,
        description=(
            "Backend deaths a message may be running at (its worker's backend died mid-request) before it "
            "fails instead of being retried: a message that crashes backends is not sent to one after "
            "another. 1 fails every message a crash interrupts; 2 retries them once"
        ),
    )
    min_generation_rate: float = Field(
        default=2.0,
        gt=0,
        description=(
            "Tokens per second a generation must average at least: a message in progress longer than "
            "in_progress_grace + max_new_tokens / min_generation_rate is retried or failed, pings or not"
        ),
    )
    in_progress_grace: float = Field(
        default=120.0, gt=0, description="Seconds added to the in-progress bound (prompt reading, queueing)"
    )


class _TrustedWorkersAndComplianceChecksSettings(BaseModel):
    """Settings: trusted workers and compliance checks."""

    trusted_worker_api_keys: list[str] = Field(
        default_factory=list,
        description="Keys of `worker_api_keys` whose workers are trusted: never compliance-checked, and "
        "the source of the checks' expected answers. Admin-created keys are untrusted until "
        "`PUT /admin/workers/{id}/trust`",
    )
    trusted_workers_only_models: list[str] = Field(
        default_factory=list,
        description="Model config names whose user work only trusted workers get (untrusted workers of "
        "these models still connect and are compliance-checked)",
    )
    trusted_workers_only_tiers: list[str] = Field(
        default_factory=list,
        description="User tiers (keys of `user_tiers`) whose work only trusted workers get, whatever the "
        "model",
    )
    compliance_check_interval: float = Field(
        default=0.0,
        ge=0,
        description="Seconds between compliance checks of each untrusted worker (a greedy job whose answer "
        "a trusted worker of the same model and build computed); 0: no checks",
    )
    compliance_spot_check_fraction: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Share of the greedy user jobs of untrusted workers replayed on a trusted worker and "
        "compared after the fact (costs trusted capacity; 0: off). A failed spot check keeps both answers "
        "for the operators",
    )
    compliance_check_max_new_tokens: int = Field(
        default=48, ge=4, le=1024, description="Tokens a compliance check asks for"
    )
    compliance_check_timeout: float = Field(
        default=120.0,
        gt=0,
        description="Seconds a compliance check may take; a check that times out or fails for backend "
        "reasons is inconclusive, never a failure",
    )
    compliance_tolerance: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="Between workers of different backend builds: the share of tokens (edit distance over "
        "the longer answer, after the first differing token) an answer may differ by; the same build "
        "must match token for token",
    )
    compliance_fail_threshold: int = Field(
        default=3,
        ge=1,
        description="Failed compliance checks (mismatches, and usage claims far over what the server "
        "counted) after which a worker's key is flagged and gets no user work",
    )
    usage_overclaim_tokens: int = Field(
        default=256,
        ge=1,
        description="A worker whose reported generated tokens exceed what the server counted by more than "
        "this fails a check (the usage billed is capped by the server's count in any case)",
    )


class _RecoverySettings(BaseModel):
    """Settings: recovery."""

    recovery_interval: float = Field(default=2.0, gt=0, description="Seconds between recovery passes")
    requeue_grace: float = Field(default=5.0, ge=0, description="Age before a pending message is re-queued")
    no_worker_timeout: float = Field(
        default=120.0,
        gt=0,
        description="A pending message fails after this long with no worker for its model",
    )
