"""Server settings, read from the environment (prefix ``OASST_SERVER_``) or a ``.env`` file."""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PLACEHOLDER_SECRETS = frozenset({"", "change-me", "changeme", "dev-secret", "dev-worker-key"})


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="OASST_SERVER_", env_file=".env", env_ignore_empty=True, extra="ignore"
    )

    environment: Literal["development", "production"] = "development"
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    log_level: str = "INFO"

    database_url: str = "sqlite+aiosqlite:///./.data/oasst-inference.db"
    database_pool_size: int = Field(default=20, ge=1)
    # None or "memory://" runs the in-process broker (a single server process only).
    broker_url: str | None = None
    redis_key_prefix: str = "oasst:"
    stream_ttl_seconds: float = Field(default=600.0, gt=0, description="Kept after a message ends")
    stream_maxlen: int = Field(default=20_000, ge=100)

    auth_secret: str = Field(default="dev-secret", description="Signs access and refresh tokens")
    access_token_expire_minutes: int = Field(default=60 * 24, ge=1)
    refresh_token_expire_days: int = Field(default=30, ge=1)
    allow_debug_auth: bool = True

    worker_api_keys: list[str] = Field(default_factory=lambda: ["dev-worker-key"])
    worker_ping_interval: float = Field(default=5.0, gt=0)
    worker_ping_timeout: float = Field(default=15.0, gt=0)
    worker_hello_timeout: float = Field(default=10.0, gt=0)
    lease_seconds: float = Field(default=30.0, gt=0, description="Extended by every token and pong")
    max_attempts: int = Field(default=3, ge=1, description="Tries per message before it fails")

    recovery_interval: float = Field(default=2.0, gt=0, description="Seconds between recovery passes")
    requeue_grace: float = Field(default=5.0, ge=0, description="Age before a pending message is re-queued")
    no_worker_timeout: float = Field(
        default=120.0,
        gt=0,
        description="A pending message fails after this long with no worker for its model",
    )

    sse_ping_interval: float = Field(default=15.0, gt=0)
    pending_update_interval: float = Field(default=1.0, gt=0)
    cors_origins: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _refuse_placeholders_in_production(self) -> Settings:
        if self.environment == "production":
            if self.auth_secret in PLACEHOLDER_SECRETS or len(self.auth_secret) < 32:
                raise ValueError("set OASST_SERVER_AUTH_SECRET to a random string of 32+ characters")
            if any(k in PLACEHOLDER_SECRETS for k in self.worker_api_keys):
                raise ValueError("set OASST_SERVER_WORKER_API_KEYS: the development key is not allowed")
            if self.allow_debug_auth:
                raise ValueError("debug auth cannot be enabled in production")
        return self

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


@lru_cache
def get_settings() -> Settings:
    return Settings()
