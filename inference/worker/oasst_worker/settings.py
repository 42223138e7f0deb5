"""Worker settings, from the environment (prefix ``OASST_WORKER_``) or a ``.env`` file."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from oasst_shared.model_configs import ModelConfig, get_model_config


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="OASST_WORKER_", env_file=".env", env_ignore_empty=True, extra="ignore"
    )

    server_url: str = Field(
        default="ws://127.0.0.1:8000", description="The inference server (ws:// or wss://)"
    )
    api_key: str = "dev-worker-key"
    backend_kind: Literal["tgi"] = "tgi"
    backend_url: str = "http://127.0.0.1:8001"
    model_config_name: str = "SmolLM2-135M-Instruct"
    # A full ModelConfig as JSON, for models not built into oasst_shared.
    model_config_json: str | None = None
    max_parallel_requests: int = Field(default=2, ge=1, le=256)
    backend_token_timeout: float = Field(default=30.0, gt=0, description="Seconds without a token: a stall")
    backend_generation_timeout: float = Field(default=900.0, gt=0, description="Bound on one generation")
    backend_health_interval: float = Field(default=5.0, gt=0)
    reconnect_min_delay: float = Field(default=0.5, gt=0)
    reconnect_max_delay: float = Field(default=30.0, gt=0)
    log_level: str = "INFO"

    def resolve_model_config(self) -> ModelConfig:
        if self.model_config_json:
            return ModelConfig.model_validate_json(self.model_config_json)
        return get_model_config(self.model_config_name)
