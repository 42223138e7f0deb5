"""Server settings, read from the environment (prefix ``OASST_SERVER_``) or a ``.env`` file."""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# The development default is 32+ bytes only so that PyJWT does not warn on every token in `make up`.
DEV_AUTH_SECRET = "dev-secret-for-local-development-only"
PLACEHOLDER_SECRETS = frozenset(
    {"", "change-me", "changeme", "dev-secret", DEV_AUTH_SECRET, "dev-worker-key"}
)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="OASST_SERVER_", env_file=".env", env_ignore_empty=True, extra="ignore"
    )

    environment: Literal["development", "production"] = "development"
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    log_level: str = "INFO"
    processes: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Server processes sharing the port (uvicorn workers); more than one needs Redis and Postgres",
    )

    database_url: str = "sqlite+aiosqlite:///./.data/oasst-inference.db"
    database_pool_size: int = Field(default=20, ge=1)
    # None or "memory://" runs the in-process broker (a single server process only).
    broker_url: str | None = None
    redis_key_prefix: str = "oasst:"
    redis_max_connections: int = Field(
        default=4096,
        ge=16,
        description="Redis connection pool size: every streaming reader and worker holds one while it waits",
    )
    stream_ttl_seconds: float = Field(default=600.0, gt=0, description="Kept after a message ends")
    stream_maxlen: int = Field(default=20_000, ge=100)

    auth_secret: str = Field(default=DEV_AUTH_SECRET, description="Signs access and refresh tokens")
    access_token_expire_minutes: int = Field(default=60, ge=1, description="Short-lived: refresh them")
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

    # ------------------------------------------------------------ database start-up (issue 3)
    database_startup_timeout: float = Field(
        default=60.0, ge=0, description="Seconds to keep retrying while the database comes up"
    )

    # ------------------------------------------------------------ users and auth
    # Web frontends that sign their users in with the ``TrustedClient`` header (the original
    # Open-Assistant inference server's format); each key authorises one frontend.
    trusted_client_api_keys: list[str] = Field(default_factory=list)
    # Public base URL of this server, used to build OAuth callback URLs (``{api_root}/auth/callback/github``).
    api_root: str = "http://127.0.0.1:8000"
    oauth_state_ttl_seconds: int = Field(default=600, ge=30)
    auth_github_client_id: str | None = None
    auth_github_client_secret: str | None = None
    auth_github_authorize_url: str = "https://github.com/login/oauth/authorize"
    auth_github_token_url: str = "https://github.com/login/oauth/access_token"
    auth_github_api_base_url: str = "https://api.github.com/"
    auth_discord_client_id: str | None = None
    auth_discord_client_secret: str | None = None
    auth_discord_authorize_url: str = "https://discord.com/api/oauth2/authorize"
    auth_discord_token_url: str = "https://discord.com/api/oauth2/token"
    auth_discord_api_base_url: str = "https://discord.com/api/"

    # ------------------------------------------------------------ admin API
    # ``Authorization: Bearer <root token>`` on /admin/...; None disables the admin API.
    admin_root_token: str | None = None

    # ------------------------------------------------------------ chat limits
    max_messages_per_chat: int = Field(default=500, ge=2)
    max_message_length: int = Field(default=16_000, ge=1, description="Characters per prompter message")
    max_queue_size: int = Field(
        default=200, ge=1, description="Pending messages per model before new ones get a 503"
    )

    # ------------------------------------------------------------ scheduling (issue 12)
    fair_queuing: bool = Field(
        default=True,
        description="Serve waiting users by least tokens received; off: one first-come-first-served queue",
    )
    fair_queue_credit_tokens: float = Field(
        default=256.0,
        ge=0,
        description="Tokens of service a user returning from idle may get ahead of those already waiting",
    )
    fair_queue_prompt_token_weight: float = Field(
        default=1.0, ge=0, description="What a prompt token counts in a user's fair share"
    )
    fair_queue_generated_token_weight: float = Field(
        default=1.0, ge=0, description="What a generated token counts in a user's fair share"
    )
    user_tiers: dict[str, float] = Field(
        default_factory=lambda: {"low": 0.5, "standard": 1.0, "priority": 2.0},
        description="Tier name -> weight: a user of weight 2 gets twice the tokens of weight 1 under load",
    )
    default_user_tier: str = Field(default="standard", description="The tier of users not given one")
    max_request_priority: int = Field(
        default=2,
        ge=0,
        le=8,
        description="Trusted clients may pass a priority in [-this, this]; each step doubles the weight",
    )
    queue_timeout: float = Field(
        default=600.0, gt=0, description="Seconds a message may wait in the queue before it fails"
    )

    # ------------------------------------------------------------ per-user limits and the OpenAI API (issue 5)
    # Counted in the database, so they hold across replicas; 0 turns a limit off.
    rate_limit_per_minute: int = Field(
        default=60,
        ge=0,
        description="Generations (chat answers, completions, embeddings) per user per minute",
    )
    max_concurrent_generations_per_user: int = Field(
        default=8, ge=0, description="Pending plus in-progress generations per user"
    )
    # Off: API requests keep only their token counts once answered. On: each API conversation is
    # stored as a chat of the user, visible in the chat list.
    store_api_conversations: bool = False

    @model_validator(mode="after")
    def _default_tier_exists(self) -> Settings:
        if self.default_user_tier not in self.user_tiers:
            raise ValueError(f"default_user_tier {self.default_user_tier!r} is not one of user_tiers")
        if any(weight <= 0 for weight in self.user_tiers.values()):
            raise ValueError("user_tiers weights must be positive")
        return self

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

    @model_validator(mode="after")
    def _refuse_placeholder_credentials_in_production(self) -> Settings:
        if self.environment != "production":
            return self
        if any(k in PLACEHOLDER_SECRETS or len(k) < 16 for k in self.trusted_client_api_keys):
            raise ValueError("OASST_SERVER_TRUSTED_CLIENT_API_KEYS: each key needs 16+ random characters")
        if self.admin_root_token is not None and (
            self.admin_root_token in PLACEHOLDER_SECRETS or len(self.admin_root_token) < 32
        ):
            raise ValueError("set OASST_SERVER_ADMIN_ROOT_TOKEN to a random string of 32+ characters")
        for provider in ("github", "discord"):
            client_id = getattr(self, f"auth_{provider}_client_id")
            secret = getattr(self, f"auth_{provider}_client_secret")
            if client_id and (secret is None or secret in PLACEHOLDER_SECRETS):
                raise ValueError(f"OASST_SERVER_AUTH_{provider.upper()}_CLIENT_SECRET is missing")
        return self

    @model_validator(mode="after")
    def _several_processes_share_redis_and_postgres(self) -> Settings:
        # The in-process broker lives in one process, and SQLite takes one writer.
        if self.processes > 1 and (not (self.broker_url or "").startswith("redis") or self.is_sqlite):
            raise ValueError("OASST_SERVER_PROCESSES > 1 needs the Redis broker and Postgres")
        return self

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


@lru_cache
def get_settings() -> Settings:
    return Settings()
