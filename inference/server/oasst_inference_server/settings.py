"""Server settings, read from the environment (prefix ``OASST_SERVER_``) or a ``.env`` file."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from oasst_inference_server.production import DEV_AUTH_SECRET, DEV_WORKER_KEY, check_production
from oasst_inference_server.trusted_client_names import parse_trusted_client_entry
from oasst_shared.limits import MAX_MESSAGE_LENGTH, MAX_REQUEST_MESSAGES


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="OASST_SERVER_", env_file=".env", env_ignore_empty=True, extra="ignore"
    )

    environment: Literal["development", "production"] = Field(
        default="production",
        description="production (the default) refuses placeholder, short or empty secrets, the debug login "
        "and a wildcard CORS origin; development (make up, the tests) must be asked for (docs/security.md)",
    )
    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(default=8000, ge=1, le=65535, description="Port to listen on.")
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING or ERROR.")
    processes: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Server processes sharing the port (uvicorn workers); more than one needs Redis and Postgres",
    )

    database_url: str = Field(
        "sqlite+aiosqlite:///./.data/oasst-inference.db",
        description="SQLAlchemy URL: `sqlite+aiosqlite:///path` (embedded) or `postgresql+asyncpg://user:password@host:5432/db` (production).",
    )
    database_pool_size: int = Field(default=20, ge=1, description="Database connections per server process.")
    # None or "memory://" runs the in-process broker (a single server process only).
    broker_url: str | None = None
    redis_key_prefix: str = Field(
        "oasst:",
        description="Prefix of every Redis key, so several deployments (or test runs) can share one Redis.",
    )
    redis_max_connections: int = Field(
        default=4096,
        ge=16,
        description="Redis connection pool size: every streaming reader and worker holds one while it waits",
    )
    stream_ttl_seconds: float = Field(default=600.0, gt=0, description="Kept after a message ends")
    stream_maxlen: int = Field(
        default=20_000, ge=100, description="Most events kept in one message's stream."
    )
    stream_idle_ttl_seconds: float = Field(
        default=3600.0,
        gt=0,
        description=(
            "A stream that never gets its terminal event (its chat was deleted mid-answer) expires this "
            "long after its last event; keep it above the in-progress bound"
        ),
    )

    auth_secret: str = Field(
        default="",
        description="Signs access and refresh tokens (32+ random characters; development has a default)",
    )
    access_token_expire_minutes: int = Field(
        default=60, ge=1, description="Lifetime of an access token (short-lived: clients refresh them)."
    )
    refresh_token_expire_days: int = Field(default=30, ge=1, description="Lifetime of a refresh token.")
    user_cache_seconds: float = Field(
        default=5.0,
        ge=0,
        le=60,
        description="How long a server process trusts the user state (deleted, token generation, tier) "
        "it read for an access token before reading it again; a change made through another process "
        "or replica (deleting a user, revoking their tokens) reaches this one within it. 0: read it on "
        "every request",
    )
    user_cache_size: int = Field(
        default=10_000, ge=1, le=1_000_000, description="Most users whose state one server process keeps."
    )
    allow_debug_auth: bool | None = Field(
        default=None,
        description="Password-less debug login (the text-client and the web page use it in development); "
        "default: on in development, off in production",
    )

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
    worker_hello_timeout: float = Field(
        default=10.0, gt=0, description="Seconds a new worker connection has to send its `worker_info` frame."
    )
    lease_seconds: float = Field(default=30.0, gt=0, description="Extended by every token and pong")
    max_attempts: int = Field(default=3, ge=1, description="Tries per message before it fails")
    max_slots_per_worker: int = Field(
        default=256,
        ge=1,
        le=1024,
        description="The most parallel requests one worker socket may announce (a key may allow fewer)",
    )
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

    recovery_interval: float = Field(default=2.0, gt=0, description="Seconds between recovery passes")
    requeue_grace: float = Field(default=5.0, ge=0, description="Age before a pending message is re-queued")
    no_worker_timeout: float = Field(
        default=120.0,
        gt=0,
        description="A pending message fails after this long with no worker for its model",
    )

    sse_ping_interval: float = Field(
        default=15.0, gt=0, description="Seconds between keep-alive comments on idle event streams."
    )
    pending_update_interval: float = Field(
        default=1.0,
        gt=0,
        description="Seconds between queue-position updates to a reader whose message waits.",
    )
    cors_origins: list[str] = Field(
        default_factory=list, description="Browser origins allowed to call the API (credentials included)"
    )

    # ------------------------------------------------------------ the edge
    max_request_body_bytes: int = Field(
        default=2 * 1024 * 1024,
        ge=1024,
        description="Largest request body, checked from Content-Length and while it streams in (413)",
    )
    request_body_timeout: float = Field(
        default=60.0,
        gt=0,
        description="Seconds a request body may take to arrive whole (then 408 and the connection closes)",
    )
    request_header_timeout: float = Field(
        default=15.0,
        gt=0,
        description="Seconds a connection may take to send a whole request line and headers, from when it "
        "opens or from the first byte of its next request (then 408 and it closes)",
    )
    max_request_header_bytes: int = Field(
        default=32 * 1024,
        ge=4096,
        description="Largest request line plus headers (then 431 and the connection closes)",
    )
    max_connections: int = Field(
        default=16_384,
        ge=1,
        description="Open connections per server process (HTTP, event streams and worker sockets); past it "
        "a new connection is answered 503 and closed, the open ones are untouched. Lowered at start to "
        "what the process's open-file limit allows",
    )

    # ------------------------------------------------------------ what production serves
    docs_enabled: bool | None = Field(
        default=None,
        description="Serve /docs, /redoc and /openapi.json; default: on in development, off in production",
    )
    metrics_enabled: bool | None = Field(
        default=None, description="Serve /metrics; default: on in development, off in production"
    )
    metrics_token: str | None = Field(
        default=None, description="When set, /metrics asks for Authorization: Bearer <token> (32+ characters)"
    )

    # ------------------------------------------------------------ database start-up
    database_startup_timeout: float = Field(
        default=60.0, ge=0, description="Seconds to keep retrying while the database comes up"
    )

    # ------------------------------------------------------------ users and auth
    # Web frontends that sign their users in with the ``TrustedClient`` header (the original
    # Open-Assistant inference server's format); each key authorises one frontend.
    trusted_client_api_keys: list[str] = Field(
        default_factory=list,
        description="NAME:KEY per frontend: the key speaks only for users that frontend created, and only "
        "with client NAME in its TrustedClient header (a bare KEY is the frontend named website)",
    )
    # Public base URL of this server, used to build OAuth callback URLs (``{api_root}/auth/callback/github``).
    api_root: str = "http://127.0.0.1:8000"
    oauth_state_ttl_seconds: int = Field(
        default=600,
        ge=30,
        description="Seconds an OAuth login may take between the redirect to the provider and the callback.",
    )
    auth_github_client_id: str | None = Field(
        None, description="GitHub OAuth app client id; unset disables GitHub login."
    )
    auth_github_client_secret: str | None = Field(None, description="GitHub OAuth app client secret.")
    auth_github_authorize_url: str = Field(
        "https://github.com/login/oauth/authorize",
        description="GitHub's authorisation page (changed only for tests).",
    )
    auth_github_token_url: str = Field(
        "https://github.com/login/oauth/access_token",
        description="GitHub's token endpoint (changed only for tests).",
    )
    auth_github_api_base_url: str = Field(
        "https://api.github.com/", description="GitHub's API (changed only for tests)."
    )
    auth_discord_client_id: str | None = Field(
        None, description="Discord OAuth app client id; unset disables Discord login."
    )
    auth_discord_client_secret: str | None = Field(None, description="Discord OAuth app client secret.")
    auth_discord_authorize_url: str = Field(
        "https://discord.com/api/oauth2/authorize",
        description="Discord's authorisation page (changed only for tests).",
    )
    auth_discord_token_url: str = Field(
        "https://discord.com/api/oauth2/token",
        description="Discord's token endpoint (changed only for tests).",
    )
    auth_discord_api_base_url: str = Field(
        "https://discord.com/api/", description="Discord's API (changed only for tests)."
    )

    # ------------------------------------------------------------ admin API
    # ``Authorization: Bearer <root token>`` on /admin/...; None disables the admin API.
    admin_root_token: str | None = None

    # ------------------------------------------------------------ chat limits
    max_messages_per_chat: int = Field(default=500, ge=2, description="Messages one chat may hold.")
    max_message_length: int = Field(
        default=16_000, ge=1, le=MAX_MESSAGE_LENGTH, description="Characters per prompter message"
    )
    max_system_prompt_length: int = Field(
        default=8_000,
        ge=1,
        le=MAX_MESSAGE_LENGTH,
        description="Characters of a system prompt (chat API and /v1)",
    )
    max_messages_per_request: int = Field(
        default=256, ge=1, le=MAX_REQUEST_MESSAGES, description="Messages of one /v1/chat/completions request"
    )
    max_chats_per_user: int = Field(
        default=1_000, ge=1, description="Chats a user may keep (hidden ones count; deleting frees room)"
    )
    max_api_keys_per_user: int = Field(default=50, ge=1, description="Unrevoked API keys per user (409)")
    max_sse_readers_per_user: int = Field(
        default=32, ge=1, description="Event streams one user may hold open at once, across replicas (429)"
    )
    max_sse_readers_per_message: int = Field(
        default=8, ge=1, description="Event streams open at once on one message, across replicas (429)"
    )
    max_queue_size: int = Field(
        default=200, ge=1, description="Pending messages per model before new ones get a 503"
    )

    # ------------------------------------------------------------ scheduling
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

    # ------------------------------------------------------------ per-user limits and the OpenAI API
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
    def _trusted_only_tiers_exist(self) -> Settings:
        unknown = [t for t in self.trusted_workers_only_tiers if t not in self.user_tiers]
        if unknown:
            raise ValueError(
                f"trusted_workers_only_tiers names tiers not in user_tiers: {', '.join(unknown)}"
            )
        return self

    @model_validator(mode="after")
    def _trusted_client_names(self) -> Settings:
        names = [parse_trusted_client_entry(e)[0] for e in self.trusted_client_api_keys]
        if len(set(names)) != len(names):
            raise ValueError("OASST_SERVER_TRUSTED_CLIENT_API_KEYS: one key per client name")
        return self

    @model_validator(mode="after")
    def _default_tier_exists(self) -> Settings:
        if self.default_user_tier not in self.user_tiers:
            raise ValueError(f"default_user_tier {self.default_user_tier!r} is not one of user_tiers")
        if any(weight <= 0 for weight in self.user_tiers.values()):
            raise ValueError("user_tiers weights must be positive")
        return self

    @model_validator(mode="after")
    def _development_defaults(self) -> Settings:
        # Known secrets and the debug login exist only when development is asked for explicitly.
        if self.environment == "development":
            if not self.auth_secret:
                self.auth_secret = DEV_AUTH_SECRET
            if not self.worker_api_keys:
                self.worker_api_keys = [DEV_WORKER_KEY]
        development = self.environment == "development"
        for flag in ("allow_debug_auth", "docs_enabled", "metrics_enabled"):
            if getattr(self, flag) is None:
                setattr(self, flag, development)
        return self

    @model_validator(mode="after")
    def _refuse_placeholders_in_production(self) -> Settings:
        if self.environment == "production":
            check_production(self)
        return self

    @model_validator(mode="after")
    def _several_processes_share_redis_and_postgres(self) -> Settings:
        # The in-process broker lives in one process (the others would never see its queues, streams
        # and locks), and SQLite takes one writer at a time.
        if self.processes == 1:
            return self
        needs = []
        if not (self.broker_url or "").startswith("redis"):
            needs.append(
                "the in-process broker cannot be shared between processes: set OASST_SERVER_BROKER_URL "
                "to a Redis URL (redis://HOST:6379/0)"
            )
        if self.is_sqlite:
            needs.append(
                "SQLite takes one writer at a time: set OASST_SERVER_DATABASE_URL to a Postgres URL "
                "(postgresql://USER:PASSWORD@HOST:5432/DB)"
            )
        if needs:
            raise ValueError(
                f"OASST_SERVER_PROCESSES={self.processes}: " + "; ".join(needs) + " (or run one process)"
            )
        return self

    def in_progress_bound(self, max_new_tokens: int) -> float:
        """Seconds a message may stay in_progress on one try."""
        return self.in_progress_grace + max_new_tokens / self.min_generation_rate

    def trusted_client_keys(self) -> dict[str, str]:
        """Client name -> its key (``trusted_client_api_keys`` entries are ``NAME:KEY`` or a bare key)."""
        return dict(parse_trusted_client_entry(entry) for entry in self.trusted_client_api_keys)

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


@lru_cache
def get_settings() -> Settings:
    return Settings()
